// Package redisserver runs real Redis servers (Debian's redis-server, which
// scripts/test.sh installs) as child processes for tenure's tests: each on a
// free 127.0.0.1 port, with persistence off and its own directory. A server
// dies with the test process (SIGKILL through Pdeathsig), so none outlives a
// test run.
package redisserver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tenure-go/tenure/internal/testnet"
)

// Program is the server binary, looked up on PATH.
const Program = "redis-server"

// Installed returns nil when redis-server can be run, or an error saying how
// to install it.
func Installed() error {
	if _, err := exec.LookPath(Program); err != nil {
		return fmt.Errorf("redisserver: %s not found (apt-get install redis-server; scripts/test.sh does it): %w", Program, err)
	}
	return nil
}

// Options configure a server. The zero value is a server without a password.
type Options struct {
	// Password, when set, is required by AUTH (requirepass).
	Password string
	// TLS, when set, makes the server speak only TLS on its port.
	TLS *TLS
	// Args are extra "--name value" arguments for redis-server.
	Args []string
}

// TLS names the PEM files of a TLS server. Clients need not present a
// certificate.
type TLS struct {
	CertFile, KeyFile, CAFile string
}

// Server is one running (or stopped) redis-server. Its methods are safe for
// concurrent use.
type Server struct {
	dir  string
	port int
	opts Options

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start runs a redis-server with its files in dir (created if missing).
func Start(dir string, opts Options) (*Server, error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Another process may bind the port between its choice and the
	// server's start (the test packages run side by side): choose again.
	for attempt := 0; ; attempt++ {
		ports, err := testnet.FreePorts(1)
		if err != nil {
			return nil, err
		}
		s := &Server{dir: dir, port: ports[0], opts: opts}
		err = s.Restart()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 2 {
			return nil, err
		}
	}
}

// errPortTaken is why a start failed when its port was taken.
var errPortTaken = errors.New("port already in use")

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// LogFile is the server's log.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "redis.log") }

// Restart starts the server again on the same port after Stop or Kill (its
// data is gone: persistence is off). It is a no-op while it runs.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	port := []string{"--port", strconv.Itoa(s.port)}
	if t := s.opts.TLS; t != nil {
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile,
			"--tls-ca-cert-file", t.CAFile, "--tls-auth-clients", "no"}
	}
	args := append(port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", s.LogFile(), "--daemonize", "no",
		"--protected-mode", "no",
	)
	if s.opts.Password != "" {
		args = append(args, "--requirepass", s.opts.Password)
	}
	args = append(args, s.opts.Args...)
	var offset int64 // this start's lines of the log begin here
	if fi, err := os.Stat(s.LogFile()); err == nil {
		offset = fi.Size()
	}
	cmd := exec.Command(Program, args...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisserver: start: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Ready when its log says so: a connection alone could reach another
	// process that took the port.
	deadline := time.Now().Add(15 * time.Second)
	for {
		tail := testnet.LogTail(s.LogFile(), offset)
		if strings.Contains(tail, "Ready to accept connections") {
			break
		}
		select {
		case werr := <-exited:
			if strings.Contains(testnet.LogTail(s.LogFile(), offset), "Address already in use") {
				return fmt.Errorf("redisserver: %w: %d", errPortTaken, s.port)
			}
			return fmt.Errorf("redisserver: redis-server exited (%v):\n%s", werr, testnet.LogTail(s.LogFile(), 0))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("redisserver: redis-server not listening after 15s:\n" + testnet.LogTail(s.LogFile(), 0))
		}
	}
	s.cmd = cmd
	go func() { // reap; a later Kill finds the process gone
		<-exited
	}()
	return nil
}

// Kill stops the server at once (SIGKILL). Restart brings it back.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	// Wait until the port is free, so that a Restart can bind it.
	for i := 0; i < 200; i++ {
		c, err := net.DialTimeout("tcp", s.Addr(), 50*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
	s.cmd = nil
}

// Close stops the server. It is idempotent.
func (s *Server) Close() { s.Kill() }
