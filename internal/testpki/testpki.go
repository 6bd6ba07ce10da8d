// Package testpki makes a throwaway certificate authority and certificates
// signed by it, for tests of TLS connections to tenure's backends. Keys are
// ECDSA P-256; certificates are valid for one day.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority whose files live in Dir. It is not safe for
// concurrent use.
type CA struct {
	// Dir holds every file the CA writes.
	Dir string
	// CertFile is the CA certificate (PEM), the file clients and servers
	// trust.
	CertFile string

	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	next int64
}

// Pair is a certificate and its private key, as PEM files.
type Pair struct {
	CertFile, KeyFile string
}

// NewCA creates a CA named name in dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, CertFile: filepath.Join(dir, name+"-ca.pem"), cert: cert, key: key, next: 2}
	if err := writePEM(ca.CertFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return ca, nil
}

// Server issues a server certificate for 127.0.0.1 and localhost, files
// named name.pem and name-key.pem.
func (ca *CA) Server(name string) (Pair, error) {
	return ca.issue(name, name, true)
}

// Client issues a client certificate whose subject common name is cn (etcd
// takes it as the user name when a request carries no password token).
func (ca *CA) Client(name, cn string) (Pair, error) {
	return ca.issue(name, cn, false)
}

func (ca *CA) issue(name, cn string, server bool) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.next),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	ca.next++
	if server {
		// etcd's server certificate also serves its own client connections.
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	p := Pair{CertFile: filepath.Join(ca.Dir, name+".pem"), KeyFile: filepath.Join(ca.Dir, name+"-key.pem")}
	if err := writePEM(p.CertFile, "CERTIFICATE", der); err != nil {
		return Pair{}, err
	}
	if err := writePEM(p.KeyFile, "PRIVATE KEY", kder); err != nil {
		return Pair{}, err
	}
	return p, nil
}

func writePEM(path, typ string, der []byte) error {
	b := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("testpki: %w", err)
	}
	return nil
}
