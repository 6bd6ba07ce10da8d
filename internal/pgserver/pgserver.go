// Package pgserver runs a real, throwaway PostgreSQL server as a child process
// for tenure's tests: a fresh cluster (initdb) in a directory of the test's,
// listening on a free 127.0.0.1 port with trust authentication, started from
// the programs of Debian's postgresql package (scripts/test.sh, run by `make
// test`, installs it).
//
// The server is a postgres process that dies with the test process (it gets
// SIGKILL when the test process exits, however it exits, and its backends
// follow it), so no server outlives a test run. It writes its log, and
// initdb's output, to a file in its own directory, never to the test output.
//
// PostgreSQL refuses to run as root. When the test process is root, as it is
// under `make test` on a fresh machine, initdb and the server run as the
// postgres system user that Debian's package creates.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-go/tenure/internal/testnet"
)

// LibDir is where Debian's postgresql-<version> packages install their
// programs, in LibDir/<version>/bin.
const LibDir = "/usr/lib/postgresql"

// User is the PostgreSQL superuser a Server is created with and DSN connects
// as; it is also the OS user initdb and the server run as when the test
// process is root (Debian's package creates it).
const User = "postgres"

const (
	// StartTimeout bounds how long Start waits for initdb, and then for the
	// server to accept connections.
	StartTimeout = 60 * time.Second
	// StopTimeout bounds how long Close waits for the server to shut down
	// before it kills it.
	StopTimeout = 10 * time.Second
)

// programs are the programs of a PostgreSQL installation that Installed
// looks for; Start runs initdb and postgres.
var programs = []string{"initdb", "pg_ctl", "postgres"}

// BinDir returns the directory holding PostgreSQL's programs: LibDir/<v>/bin
// for the highest version v installed there that has initdb, pg_ctl and
// postgres or, failing that, the directory of postgres on PATH if initdb and
// pg_ctl are next to it.
func BinDir() (string, error) {
	type install struct {
		dir     string
		version []int
	}
	var found []install
	entries, _ := os.ReadDir(LibDir) // a missing LibDir is no installation
	for _, e := range entries {
		v, ok := parseVersion(e.Name())
		if !ok {
			continue
		}
		dir := filepath.Join(LibDir, e.Name(), "bin")
		if hasPrograms(dir) {
			found = append(found, install{dir, v})
		}
	}
	if len(found) > 0 {
		sort.Slice(found, func(i, j int) bool { return versionLess(found[j].version, found[i].version) })
		return found[0].dir, nil
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil && hasPrograms(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	return "", fmt.Errorf("pgserver: PostgreSQL is not installed (no %s in %s/<version>/bin, nor on PATH): run `make test`, which installs Debian's postgresql package",
		strings.Join(programs, ", "), LibDir)
}

// parseVersion parses a directory name such as "15" or "9.6".
func parseVersion(name string) ([]int, bool) {
	var v []int
	for f := range strings.SplitSeq(name, ".") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, false
		}
		v = append(v, n)
	}
	return v, true
}

func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func hasPrograms(dir string) bool {
	for _, p := range programs {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// Installed reports whether Start can run: nil if initdb, pg_ctl and
// postgres are found (see BinDir) and, when the test process is root, the
// postgres OS user exists; else an error that says what is missing and to run
// `make test`, which installs Debian's postgresql package.
func Installed() error {
	if _, err := BinDir(); err != nil {
		return err
	}
	if _, err := runAs(); err != nil {
		return err
	}
	return nil
}

// runAs returns the credential initdb and the server run with: nil (the test
// process's own user) unless the test process is root, then the postgres
// user's, without root's supplementary groups.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(User)
	if err != nil {
		return nil, fmt.Errorf("pgserver: PostgreSQL refuses to run as root and there is no %q user to run it as (%v): run `make test`, which installs Debian's postgresql package, which creates it", User, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgserver: user %q: %w", User, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}

// Server is a running PostgreSQL server. Its methods are safe for concurrent
// use. Stop it with Close.
type Server struct {
	dir  string
	bin  string
	port int
	cred *syscall.Credential // nil: the test process's own user

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil when not running
	done chan struct{} // closed when cmd has exited
}

// Start creates a PostgreSQL cluster in dir/data with initdb and runs a
// server on it, on a free 127.0.0.1 port, logging to dir/postgres.log. dir is
// created if needed; if it is "", Start makes a new temporary directory;
// dir/data must not exist yet, or be empty.
//
// The cluster has the superuser postgres (User), UTF8 encoding and the C
// locale. The server listens on 127.0.0.1 only, trusts every connection
// from there (no password), has no Unix-domain socket, and runs with fsync,
// synchronous_commit and full_page_writes off: test data need not survive a
// machine crash. Other settings are PostgreSQL's defaults (max_connections
// 100).
//
// When the test process is root, initdb and the server run as the postgres
// user: Start makes it the owner of dir/data and, where a directory above
// dir is not searchable by it, makes that directory searchable by all
// (o+x) if it lies under os.TempDir() (as t.TempDir()'s directories do), or
// fails.
//
// Start returns once the server accepts connections; it fails after
// StartTimeout (60 s) with the tail of the log. Close never removes dir.
func Start(dir string) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "pgserver-"); err != nil {
			return nil, fmt.Errorf("pgserver: %w", err)
		}
	} else if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	s := &Server{dir: dir, bin: bin, cred: cred}
	if err := s.initdb(); err != nil {
		return nil, err
	}
	// Free ports are found by binding port 0 and letting go; something else
	// may take one before the server binds it, so on a bind failure start
	// over on another port (the cluster stays).
	const attempts = 3
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 1; ; attempt++ {
		ports, err := testnet.FreePorts(1)
		if err != nil {
			return nil, err
		}
		s.port = ports[0]
		err = s.launch()
		if err == nil {
			err = s.waitLocked()
		}
		if err == nil {
			return s, nil
		}
		s.stopLocked(0)
		if attempt == attempts || !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
}

var errPortTaken = errors.New("port already in use")

// Dir is the directory Start ran the server in.
func (s *Server) Dir() string { return s.dir }

// DataDir is the cluster's data directory, Dir()/data.
func (s *Server) DataDir() string { return filepath.Join(s.dir, "data") }

// LogFile is the path of the server's log file (with initdb's output at its
// start), Dir()/postgres.log.
func (s *Server) LogFile() string { return filepath.Join(s.dir, "postgres.log") }

// Port is the server's TCP port on 127.0.0.1.
func (s *Server) Port() int { return s.port }

// Addr is the server's address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// DSN returns a connection string (URL form, as pgx and lib/pq take it) for
// database db as the superuser postgres, without TLS, such as
// "postgres://postgres@127.0.0.1:5432/db?sslmode=disable". The cluster starts
// with the databases postgres, template0 and template1; make others with
// CreateDatabase.
func (s *Server) DSN(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(User),
		Host:     s.Addr(),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// CreateDatabase creates database name (any name: it is quoted as an
// identifier), owned by postgres. It fails if the database exists, or after
// 30 s.
func (s *Server) CreateDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: create database %q: %w", name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return fmt.Errorf("pgserver: create database %q: %w", name, err)
	}
	return nil
}

// Close stops the server and waits for it to exit: it asks for a fast
// shutdown (SIGINT: open transactions are rolled back and clients are
// disconnected, where SIGTERM's smart shutdown would wait for every client to
// leave), then, after StopTimeout (10 s), kills it. It is idempotent and
// leaves Dir in place.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked(StopTimeout)
}

// stopLocked stops the server, killing it at once if grace is 0 or once
// grace has passed since SIGINT; s.mu is held.
func (s *Server) stopLocked(grace time.Duration) {
	if s.cmd == nil {
		return
	}
	if grace > 0 {
		_ = s.cmd.Process.Signal(syscall.SIGINT) // fails only if it already exited
		t := time.NewTimer(grace)
		select {
		case <-s.done:
		case <-t.C:
		}
		t.Stop()
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Stdin = nil
	cmd.SysProcAttr = sysProcAttr(s.cred)
	// initdb and postgres take their data directory from -D, but a stray
	// PGDATA, PGPORT or the like should not matter.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	return cmd
}

func (s *Server) openLog(format string, args ...any) (*os.File, error) {
	log, err := os.OpenFile(s.LogFile(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgserver: %w", err)
	}
	fmt.Fprintf(log, "==== pgserver: "+format+" at %s\n", append(args, time.Now().Format(time.RFC3339Nano))...)
	return log, nil
}

// initdb prepares dir and creates the cluster in dir/data.
func (s *Server) initdb() error {
	data := s.DataDir()
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	if err := os.Mkdir(data, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("pgserver: %w", err)
	}
	if s.cred != nil {
		if err := os.Chown(data, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if err := searchable(data, s.cred); err != nil {
			return err
		}
	}
	log, err := s.openLog("initdb %s (%s)", data, s.bin)
	if err != nil {
		return err
	}
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	cmd := s.command("initdb",
		"-D", data,
		"-U", User,
		"--auth=trust",
		"--encoding=UTF8",
		"--locale=C",
		"--no-sync", // test data need not survive a machine crash
		"--no-instructions",
	)
	cmd.Dir = data
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: initdb: %w", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-waited
		err = fmt.Errorf("not done after %v", StartTimeout)
	}
	if err != nil {
		return fmt.Errorf("pgserver: initdb %s: %w; tail of %s:\n%s", data, err, s.LogFile(), testnet.LogTail(s.LogFile(), 0))
	}

	// The server's settings go after initdb's in postgresql.conf (the last
	// setting wins); the port is on the command line.
	conf := strings.Join([]string{
		"",
		"# Written by tenure's internal/pgserver.",
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"fsync = off",
		"synchronous_commit = off",
		"full_page_writes = off",
		"logging_collector = off",
		"log_destination = 'stderr'",
		"",
	}, "\n")
	if err := appendFile(filepath.Join(data, "postgresql.conf"), conf); err != nil {
		return err
	}
	hba := strings.Join([]string{
		"# Written by tenure's internal/pgserver: anyone on 127.0.0.1, no password.",
		"# TYPE  DATABASE     USER  ADDRESS       METHOD",
		"host    all          all   127.0.0.1/32  trust",
		"host    replication  all   127.0.0.1/32  trust",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	return nil
}

// searchable makes sure cred's user can search every directory above path,
// granting o+x to those under os.TempDir() that it cannot.
func searchable(path string, cred *syscall.Credential) error {
	tmp, err := filepath.Abs(os.TempDir())
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pgserver: %w", err)
		}
		if !canSearch(fi, cred) {
			if rel, err := filepath.Rel(tmp, p); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
				return fmt.Errorf("pgserver: user %s (uid %d), which runs PostgreSQL for root, cannot search %s, above %s: use a directory under %s, or make it searchable",
					User, cred.Uid, p, path, tmp)
			}
			if err := os.Chmod(p, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pgserver: %w", err)
			}
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// canSearch reports whether cred's user, with only its primary group, may
// search directory fi.
func canSearch(fi os.FileInfo, cred *syscall.Credential) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return true // cannot tell: let initdb say
	}
	perm := fi.Mode().Perm()
	switch {
	case st.Uid == cred.Uid:
		return perm&0o100 != 0
	case st.Gid == cred.Gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// launch starts the server's postgres process; s.mu is held.
func (s *Server) launch() error {
	log, err := s.openLog("starting postgres on %s", s.Addr())
	if err != nil {
		return err
	}
	defer log.Close() // the child has its own descriptor
	cmd := s.command("postgres", "-D", s.DataDir(), "-p", strconv.Itoa(s.port))
	cmd.Dir = s.DataDir()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // a killed server exits with an error, which says nothing
		close(done)
	}()
	s.cmd, s.done = cmd, done
	return nil
}

// waitLocked waits until the server accepts connections to database
// postgres; s.mu is held.
func (s *Server) waitLocked() error {
	var offset int64 // where this run's log begins
	if fi, err := os.Stat(s.LogFile()); err == nil {
		offset = fi.Size()
	}
	cfg, err := pgx.ParseConfig(s.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	cfg.ConnectTimeout = time.Second
	deadline := time.Now().Add(StartTimeout)
	var lastErr error
	for {
		select {
		case <-s.done:
			tail := testnet.LogTail(s.LogFile(), 0)
			err := fmt.Errorf("pgserver: postgres on %s exited while starting; tail of %s:\n%s", s.Addr(), s.LogFile(), tail)
			if strings.Contains(testnet.LogTail(s.LogFile(), offset), "Address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		lastErr = err
		if time.Now().After(deadline) {
			return fmt.Errorf("pgserver: postgres on %s not accepting connections after %v (last: %v); tail of %s:\n%s",
				s.Addr(), StartTimeout, lastErr, s.LogFile(), testnet.LogTail(s.LogFile(), 0))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
