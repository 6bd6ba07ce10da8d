package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/zkelect"
)

// passwordEnv is the environment variable the backend password may come
// from. It is not a flag: a password on a command line is visible to every
// user of the machine (ps, /proc). tenure exec removes it from CMD's
// environment.
const passwordEnv = "TENURE_PASSWORD"

// security holds the flags that secure the connection to the backend. The
// password is read from --password-file or TENURE_PASSWORD by validate and
// is never printed: not in errors, logs or --help.
type security struct {
	caCert, cert, certKey string
	user, passwordFile    string
	zkACL                 string

	password string // read by validate
}

// ZooKeeper ACLs --zk-acl accepts.
const (
	zkACLOpen        = "open"         // world:anyone all, the default without --user
	zkACLCreator     = "creator"      // the authenticated user only, the default with --user
	zkACLCreatorRead = "creator-read" // the user, plus world read for observers
)

func (s *security) register(fs *flag.FlagSet) {
	fs.StringVar(&s.caCert, "cacert", "", "etcd and redis: PEM file of the CA that signed the servers' certificates (turns TLS on)")
	fs.StringVar(&s.cert, "cert", "", "etcd and redis: PEM client certificate, for servers that ask for one (turns TLS on; needs --cert-key)")
	fs.StringVar(&s.certKey, "cert-key", "", "etcd and redis: PEM private key of --cert (--key is the election key)")
	fs.StringVar(&s.user, "user", "", "user name: etcd's auth user, ZooKeeper's digest user, or a Redis ACL user (default for requirepass); the password comes from --password-file or "+passwordEnv)
	fs.StringVar(&s.passwordFile, "password-file", "", "file holding the password of --user (one line; a trailing newline is ignored)")
	fs.StringVar(&s.zkACL, "zk-acl", "", "zk: ACL of the nodes tenure creates: open (anyone may delete them), creator (only --user), creator-read (only --user, anyone may read); default creator with --user, else open")
}

// maxPasswordFile bounds what is read of --password-file: a path that
// names a device or a huge file by mistake (/dev/zero) must be an error,
// not a process that grows until it dies.
const maxPasswordFile = 64 << 10

// readSmall reads the file at path, refusing one longer than max bytes.
// Not only regular files: a pipe (<(pass show db)) is a fine source.
func readSmall(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("longer than %d bytes: not a password", max)
	}
	return b, nil
}

// validate checks the flags against backend ("etcd", "zookeeper" or "redis") and
// reads the password. Errors name files and flags, never the password.
func (s *security) validate(backend string) error {
	envPW, envSet := os.LookupEnv(passwordEnv)
	switch {
	case s.passwordFile != "" && envSet:
		return fmt.Errorf("both --password-file and %s are set: use one", passwordEnv)
	case s.passwordFile != "":
		b, err := readSmall(s.passwordFile, maxPasswordFile)
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err // the path is in the message already
			}
			return fmt.Errorf("--password-file %s: %w", s.passwordFile, err)
		}
		b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
		if len(b) == 0 {
			return fmt.Errorf("--password-file %s is empty", s.passwordFile)
		}
		if bytes.ContainsAny(b, "\r\n") {
			return fmt.Errorf("--password-file %s holds more than one line", s.passwordFile)
		}
		s.password = string(b)
	case envSet:
		if envPW == "" {
			return fmt.Errorf("%s is set but empty", passwordEnv)
		}
		s.password = envPW
	}
	if s.user == "" && s.password != "" {
		return errors.New("a password (--password-file or " + passwordEnv + ") without --user")
	}
	if s.user != "" && s.password == "" {
		return fmt.Errorf("--user %s needs a password: --password-file or %s", s.user, passwordEnv)
	}
	if backend == "zookeeper" {
		if s.caCert != "" || s.cert != "" || s.certKey != "" {
			return errors.New("--cacert, --cert and --cert-key are for etcd and redis: tenure does not speak TLS to ZooKeeper (see docs/security.md)")
		}
		if strings.Contains(s.user, ":") {
			return fmt.Errorf("--user %q: a ZooKeeper digest user name cannot hold ':'", s.user)
		}
		switch s.zkACL {
		case "", zkACLOpen:
		case zkACLCreator, zkACLCreatorRead:
			if s.user == "" {
				return fmt.Errorf("--zk-acl %s needs --user: ZooKeeper gives the creator's permissions to an authenticated user", s.zkACL)
			}
		default:
			return fmt.Errorf("--zk-acl %q: want open, creator or creator-read", s.zkACL)
		}
		return nil
	}
	if s.zkACL != "" {
		if backend == "redis" {
			return errors.New("--zk-acl is for ZooKeeper; on Redis, what --user may do is its ACL rule (see docs/security.md)")
		}
		return errors.New("--zk-acl is for ZooKeeper; etcd's permissions are the user's role (see docs/security.md)")
	}
	if (s.cert == "") != (s.certKey == "") {
		return errors.New("--cert and --cert-key go together: set both or neither")
	}
	return nil
}

// etcd fills in cfg's TLS and credentials.
func (s *security) etcd(cfg *clientv3.Config) error {
	return etcdelect.Security{CAFile: s.caCert, CertFile: s.cert, KeyFile: s.certKey, Username: s.user, Password: s.password}.Apply(cfg)
}

// zk returns the zkelect options for the flags.
func (s *security) zk() []zkelect.Option {
	var opts []zkelect.Option
	if s.user != "" {
		opts = append(opts, zkelect.WithDigestAuth(s.user, s.password))
	}
	switch s.zkACL {
	case zkACLCreator:
		opts = append(opts, zkelect.WithCreatorACL(false))
	case zkACLCreatorRead:
		opts = append(opts, zkelect.WithCreatorACL(true))
	case zkACLOpen:
		if s.user != "" {
			opts = append(opts, zkelect.WithACL(zkelect.OpenACL()))
		}
	}
	return opts
}

// childEnv is the environment CMD runs with: tenure's own, without the
// backend's credentials and TLS settings and this tenure's metrics
// settings (notForTheChild).
func childEnv() []string {
	env := os.Environ()
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !notForTheChild[name] {
			out = append(out, kv)
		}
	}
	return out
}

// notForTheChild are the variables of tenure's environment that CMD does
// not get: the password and every other auth or TLS setting (the path of
// the password's file, of the client key; a user name without its
// password would only make a tenure call inside CMD fail), as the README
// promises; and what configures this tenure's own metrics (a tenure exec
// inside CMD would bind the same address, and fail, or write over the
// same file).
var notForTheChild = map[string]bool{
	passwordEnv: true, "TENURE_PASSWORD_FILE": true, "TENURE_USER": true,
	"TENURE_CACERT": true, "TENURE_CERT": true, "TENURE_CERT_KEY": true, "TENURE_ZK_ACL": true,
	"TENURE_METRICS_ADDR": true, "TENURE_METRICS_FILE": true,
}

// etcdDialError explains why clientv3.New failed: refused credentials, or
// no answer within the dial timeout (a plaintext client at a TLS-only
// server, or the reverse, also ends there).
func (s *security) etcdDialError(endpoints string, timeout time.Duration, err error) error {
	if errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrAuthNotEnabled) || errors.Is(err, rpctypes.ErrUserEmpty) {
		return fmt.Errorf("%w: etcd at %s refused user %q: %w", tenure.ErrInvalidConfig, endpoints, s.user, err)
	}
	tlsOn := "off (no --cacert, --cert)"
	if s.caCert != "" || s.cert != "" {
		tlsOn = "on"
	}
	return fmt.Errorf("%w: cannot reach etcd at %s within %v (TLS %s): %w", tenure.ErrUnavailable, endpoints, timeout, tlsOn, err)
}

// shown returns an identity for a terminal: as is when it is valid UTF-8,
// printable and has no spaces, quoted otherwise (another client's data
// could hold escape sequences, 8-bit ones such as CSI 0x9b included).
func shown(identity string) string {
	if !utf8.ValidString(identity) {
		return strconv.Quote(identity)
	}
	for _, r := range identity {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return strconv.Quote(identity)
		}
	}
	if identity == "" {
		return `""`
	}
	return identity
}
