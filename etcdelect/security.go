package etcdelect

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
)

// Security is the client side of an etcd cluster's security: TLS (the CA
// that signed the servers' certificates, and a client certificate) and a
// user name and password. The zero value adds nothing: plaintext, no
// authentication. A Security is a plain value, safe to copy and to use from
// several goroutines; its String and GoString never show the password.
//
// The Backend works with any *clientv3.Client; Security only fills in a
// clientv3.Config for the common cases (see docs/security.md for the role a
// service's user needs).
type Security struct {
	// CAFile is a PEM file of the CAs that sign the servers' certificates.
	// Default "": the system's roots, and only when TLS is on (CertFile
	// set).
	CAFile string
	// CertFile and KeyFile are the client certificate and its key (PEM),
	// for servers started with --client-cert-auth. Both or neither.
	// Default "": no client certificate. With a certificate and no
	// Username, etcd authenticates the client as the certificate's common
	// name.
	CertFile, KeyFile string
	// Username and Password authenticate to an etcd with auth enabled.
	// Default "": no password authentication. Read the password from a
	// file or the environment, never from a command line.
	Username, Password string
}

// TLS reports whether s asks for TLS: a CA or a client certificate is set.
func (s Security) TLS() bool { return s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" }

// TLSConfig builds the client TLS configuration, or returns nil when s asks
// for no TLS. Errors name the file, never its contents, and wrap
// tenure.ErrInvalidConfig.
func (s Security) TLSConfig() (*tls.Config, error) {
	if !s.TLS() {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: etcd CA file: %w", tenure.ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: etcd CA file %s holds no PEM certificate", tenure.ErrInvalidConfig, s.CAFile)
		}
		cfg.RootCAs = pool
	}
	switch {
	case s.CertFile != "" && s.KeyFile != "":
		pair, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			// LoadX509KeyPair's errors describe, they do not quote, the key.
			return nil, fmt.Errorf("%w: etcd client certificate %s / key %s: %w", tenure.ErrInvalidConfig, s.CertFile, s.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	case s.CertFile != "" || s.KeyFile != "":
		return nil, fmt.Errorf("%w: etcd client certificate and key go together: set both or neither", tenure.ErrInvalidConfig)
	}
	return cfg, nil
}

// Validate checks s without reading its files. Errors wrap
// tenure.ErrInvalidConfig.
func (s Security) Validate() error {
	var errs []error
	if (s.CertFile == "") != (s.KeyFile == "") {
		errs = append(errs, errors.New("client certificate and key go together: set both or neither"))
	}
	if s.Password != "" && s.Username == "" {
		errs = append(errs, errors.New("a password without a user name"))
	}
	if s.Username != "" && s.Password == "" {
		errs = append(errs, fmt.Errorf("user %q without a password", s.Username))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: etcd: %w", tenure.ErrInvalidConfig, errors.Join(errs...))
}

// Apply sets cfg's TLS, Username and Password from s. It leaves cfg alone
// when s is the zero value.
func (s Security) Apply(cfg *clientv3.Config) error {
	if err := s.Validate(); err != nil {
		return err
	}
	t, err := s.TLSConfig()
	if err != nil {
		return err
	}
	if t != nil {
		cfg.TLS = t
	}
	if s.Username != "" {
		cfg.Username, cfg.Password = s.Username, s.Password
	}
	return nil
}

// String describes s with the password redacted.
func (s Security) String() string {
	pw := ""
	if s.Password != "" {
		pw = "[redacted]"
	}
	return fmt.Sprintf("{CAFile:%s CertFile:%s KeyFile:%s Username:%s Password:%s}", s.CAFile, s.CertFile, s.KeyFile, s.Username, pw)
}

// GoString is String, so that %#v does not show the password either.
func (s Security) GoString() string { return "etcdelect.Security" + s.String() }
