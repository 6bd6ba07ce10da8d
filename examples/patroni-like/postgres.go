package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
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
)

// Postgres drives one local PostgreSQL instance: it creates the data
// directory (initdb or pg_basebackup), rewinds it (pg_rewind), writes the
// settings the manager owns, and runs the postmaster as a child process.
//
// The postmaster runs as the manager's child and gets SIGKILL when the
// manager dies, however it dies: a primary whose manager is gone stops
// accepting writes at once, which is what Patroni needs a watchdog for.
//
// Its methods are safe for concurrent use.
type Postgres struct {
	bin    string
	data   string
	host   string
	port   int
	name   string
	peers  []string // every member's PostgreSQL host, this one's included
	params map[string]string
	cred   *syscall.Credential // nil: the manager's own user
	logf   string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// managerConf is the file, included by postgresql.conf, that holds the
// settings the manager changes at run time. The manager rewrites it after
// every pg_basebackup and pg_rewind, which copy the source's.
const managerConf = "manager.conf"

// NewPostgres prepares (does not start) the instance of cfg.
func NewPostgres(cfg Config) (*Postgres, error) {
	bin := cfg.PostgreSQL.BinDir
	if bin == "" {
		var err error
		if bin, err = findBinDir(); err != nil {
			return nil, err
		}
	}
	host, port, _ := net.SplitHostPort(cfg.Self().Postgres) // validated
	n, _ := strconv.Atoi(port)
	p := &Postgres{bin: bin, data: cfg.PostgreSQL.DataDir, host: host, port: n, name: cfg.Name,
		params: cfg.PostgreSQL.Parameters, logf: cfg.PostgreSQL.DataDir + ".log"}
	for _, m := range cfg.Members {
		if h, _, err := net.SplitHostPort(m.Postgres); err == nil { // validated
			p.peers = append(p.peers, h)
		}
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(cfg.PostgreSQL.RunAs)
		if err != nil {
			return nil, fmt.Errorf("PostgreSQL refuses to run as root, and user %q (postgresql.run_as) does not exist: %w", cfg.PostgreSQL.RunAs, err)
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("user %q: %w", cfg.PostgreSQL.RunAs, err)
		}
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	}
	return p, nil
}

// findBinDir returns the newest /usr/lib/postgresql/<v>/bin holding the
// programs the manager runs.
func findBinDir() (string, error) {
	const lib = "/usr/lib/postgresql"
	entries, _ := os.ReadDir(lib)
	var versions []int
	for _, e := range entries {
		if v, err := strconv.Atoi(e.Name()); err == nil {
			if _, err := os.Stat(filepath.Join(lib, e.Name(), "bin", "pg_rewind")); err == nil {
				versions = append(versions, v)
			}
		}
	}
	if len(versions) == 0 {
		return "", fmt.Errorf("no PostgreSQL in %s/<version>/bin: install Debian's postgresql package, or set postgresql.bin_dir", lib)
	}
	sort.Ints(versions)
	return filepath.Join(lib, strconv.Itoa(versions[len(versions)-1]), "bin"), nil
}

// Addr is where the instance listens, host:port.
func (p *Postgres) Addr() string { return net.JoinHostPort(p.host, strconv.Itoa(p.port)) }

// LogFile is where the instance and the programs the manager runs on it
// write their output: the data directory's path plus ".log".
func (p *Postgres) LogFile() string { return p.logf }

// DSN is a connection string for database postgres on this instance.
func (p *Postgres) DSN() string { return dsn(p.Addr()) }

func dsn(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable connect_timeout=2", host, port)
}

// HasData reports whether the data directory holds a whole cluster: its
// PG_VERSION, written first, and its control file, which pg_basebackup
// copies last (a copy cut short by a crash is no data, and is copied again).
func (p *Postgres) HasData() bool {
	for _, f := range []string{"PG_VERSION", filepath.Join("global", "pg_control")} {
		if _, err := os.Stat(filepath.Join(p.data, f)); err != nil {
			return false
		}
	}
	return true
}

// prepareDir creates an empty data directory owned by the PostgreSQL user,
// removing what was there before: nothing, an empty directory, a
// PostgreSQL data directory (PG_VERSION), or one this manager made (its
// mark, next to it: a partial copy or bootstrap, which lacks PG_VERSION).
// Any other directory (a data_dir set by mistake to a directory in use)
// is left alone, with an error.
func (p *Postgres) prepareDir() error {
	if entries, err := os.ReadDir(p.data); err == nil && len(entries) > 0 {
		_, errPG := os.Stat(filepath.Join(p.data, "PG_VERSION"))
		_, errMark := os.Stat(p.ownedPath())
		if errPG != nil && errMark != nil {
			return fmt.Errorf("data_dir %s holds files but no PostgreSQL data directory: the manager deletes only what it made; empty it, or set postgresql.data_dir to a new directory", p.data)
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.RemoveAll(p.data); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p.data), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(p.ownedPath(), []byte("the data directory next to this file is the patroni-like manager's: it may delete it to copy the primary afresh\n"), 0o644); err != nil {
		return err
	}
	if err := os.Mkdir(p.data, 0o700); err != nil {
		return err
	}
	if p.cred != nil {
		if err := os.Chown(p.data, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return err
		}
		// The PostgreSQL user must be able to reach the data directory.
		for d := filepath.Dir(p.data); d != filepath.Dir(d); d = filepath.Dir(d) {
			fi, err := os.Stat(d)
			if err != nil {
				return err
			}
			if fi.Mode().Perm()&0o001 == 0 {
				if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// run runs one of PostgreSQL's programs as the PostgreSQL user, its output
// appended to the log file.
func (p *Postgres) run(ctx context.Context, prog string, args ...string) error {
	log, err := p.openLog("%s %s", prog, strings.Join(args, " "))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := p.command(ctx, prog, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	_, _ = log.Write(out.Bytes())
	if err != nil {
		return fmt.Errorf("%s: %w: %s", prog, err, lastLines(out.String(), 5))
	}
	return nil
}

func (p *Postgres) command(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, prog), args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true, Credential: p.cred}
	// When ctx ends, the program's whole process group goes: pg_rewind
	// runs postgres --single as its child, which would otherwise go on
	// with the data directory, and hold the output pipe (and Wait) until
	// its recovery ended. Wait then gives up on the output 5 s later.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "LC_ALL=C")
	return cmd
}

func (p *Postgres) openLog(format string, args ...any) (*os.File, error) {
	f, err := os.OpenFile(p.logf, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "==== %s %s\n", time.Now().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
	return f, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Initdb creates a new cluster with data checksums (which pg_rewind needs)
// and the manager's settings.
func (p *Postgres) Initdb(ctx context.Context) error {
	if err := p.prepareDir(); err != nil {
		return err
	}
	if err := p.run(ctx, "initdb", "-D", p.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
		"--locale=C", "--data-checksums", "--no-sync", "--no-instructions"); err != nil {
		return err
	}
	return p.writeBaseConf()
}

// Promoted reports whether the PostgreSQL at addr answers and is out of
// recovery: a primary. A member that has just won the key is still a
// standby until its promotion ends, and a base backup taken from it then
// fails ("the standby was promoted during online backup").
func Promoted(ctx context.Context, addr string) bool {
	conn, err := pgx.Connect(ctx, dsn(addr))
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var inRecovery bool
	return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery) == nil && !inRecovery
}

// BaseBackup copies the data directory of the primary at addr, with the WAL
// needed to start from it.
func (p *Postgres) BaseBackup(ctx context.Context, addr string) error {
	if err := p.prepareDir(); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(addr)
	if err := p.run(ctx, "pg_basebackup", "-D", p.data, "-h", host, "-p", port, "-U", "postgres",
		"-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		_ = os.RemoveAll(filepath.Join(p.data, "PG_VERSION")) // not a usable cluster
		return err
	}
	return nil
}

// Rewind makes the stopped instance's data directory a copy of the primary
// at addr's history: it undoes what this instance wrote after their
// timelines forked (pg_rewind; a no-op when they did not). pg_rewind
// completes crash recovery first if the instance was not shut down cleanly.
func (p *Postgres) Rewind(ctx context.Context, addr string) error {
	_ = os.Remove(filepath.Join(p.data, "standby.signal")) // single-user crash recovery must not wait for WAL
	// pg_rewind reads the source's timeline from its control file, which
	// shows a promotion only after a checkpoint.
	if conn, err := pgx.Connect(ctx, dsn(addr)); err == nil {
		_, _ = conn.Exec(ctx, `CHECKPOINT`)
		conn.Close(ctx)
	}
	return p.run(ctx, "pg_rewind", "-D", p.data, "--source-server="+dsn(addr), "--no-sync")
}

// Control returns the fields pg_controldata prints, such as "Database
// cluster state" ("in production", "shut down", "in archive recovery",
// "shut down in recovery") and "Latest checkpoint's TimeLineID".
func (p *Postgres) Control(ctx context.Context) (map[string]string, error) {
	cmd := p.command(ctx, "pg_controldata", "-D", p.data)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("pg_controldata: %w", err)
	}
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, nil
}

// SystemID reads the data directory's database system identifier, which
// initdb draws at random and every copy (pg_basebackup) keeps: it names the
// cluster the data belongs to.
func (p *Postgres) SystemID(ctx context.Context) (string, error) {
	f, err := p.Control(ctx)
	if err != nil {
		return "", err
	}
	id := f["Database system identifier"]
	if id == "" {
		return "", errors.New("pg_controldata shows no database system identifier")
	}
	return id, nil
}

// WasPrimary reports whether the stopped instance last ran as a primary
// after a promotion (a new cluster, on timeline 1, never did): such data may
// hold writes the current primary never saw, and must be rewound before it
// can stream.
func (p *Postgres) WasPrimary(ctx context.Context) (bool, error) {
	f, err := p.Control(ctx)
	if err != nil {
		return false, err
	}
	switch f["Database cluster state"] {
	case "in production", "shut down", "in crash recovery", "shutting down":
		return f["Latest checkpoint's TimeLineID"] != "1", nil
	}
	return false, nil
}

// CrashedStandby reports whether the stopped instance ran as a standby and
// did not shut down cleanly (killed, its host crashed): its control file
// says "in archive recovery".
func (p *Postgres) CrashedStandby(ctx context.Context) (bool, error) {
	f, err := p.Control(ctx)
	if err != nil {
		return false, err
	}
	return f["Database cluster state"] == "in archive recovery", nil
}

// MarkNeedsRewind records (on) or clears (off) that the data directory
// was a primary's and has not been rewound onto a later primary since: it
// may hold WAL that a member promoted after it never had. The mark is a
// file next to the data directory, so that it outlives the manager: once
// the data has run as a standby again, the control file no longer says
// it was a primary's (WasPrimary).
func (p *Postgres) MarkNeedsRewind(on bool) error {
	if !on {
		if err := os.Remove(p.markPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return os.WriteFile(p.markPath(), []byte("this data directory was a primary's: rewind it onto the current primary before it streams or is promoted\n"), 0o644)
}

// ownedPath is the file next to the data directory that says the manager
// made it (prepareDir).
func (p *Postgres) ownedPath() string { return p.data + ".managed" }

// markPath is the needs-rewind mark's file: the data directory's path
// plus ".needs-rewind".
func (p *Postgres) markPath() string { return p.data + ".needs-rewind" }

// MarkedNeedsRewind reports whether MarkNeedsRewind(true) was the last
// call on this data directory.
func (p *Postgres) MarkedNeedsRewind() bool {
	_, err := os.Stat(p.markPath())
	return err == nil
}

// writeBaseConf appends the settings every member needs to postgresql.conf
// (copied by pg_basebackup and pg_rewind to the others) and trusts
// connections from loopback and the members' hosts (hbaConf). What is the member's own (its address, its
// parameters) goes to managerConf (Configure), which each member writes
// for itself.
func (p *Postgres) writeBaseConf() error {
	var b strings.Builder
	b.WriteString("\n# Written by the patroni-like manager. Each member's own settings are in " + managerConf + ".\n")
	for _, kv := range [][2]string{
		{"unix_socket_directories", "''"},
		{"wal_level", "replica"},
		{"hot_standby", "on"},
		{"max_wal_senders", "10"},
		{"wal_keep_size", "'256MB'"},
		{"wal_log_hints", "on"},
		{"full_page_writes", "on"},
		{"logging_collector", "off"},
	} {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
	}
	fmt.Fprintf(&b, "include_if_exists = '%s'\n", managerConf)
	f, err := os.OpenFile(filepath.Join(p.data, "postgresql.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return p.writeFile("pg_hba.conf", hbaConf(p.peers))
}

// hbaConf is the pg_hba.conf every member shares: trust, no password,
// from loopback and from each member's PostgreSQL host. The manager
// connects to its own PostgreSQL through its member's address, and a
// standby replicates from the primary's, so a member on 10.0.0.11 needs
// 10.0.0.11 trusted on every member.
func hbaConf(hosts []string) string {
	var b strings.Builder
	b.WriteString("# Written by the patroni-like manager: loopback and the members' hosts, no password.\n")
	seen := map[string]bool{}
	for _, h := range append([]string{"127.0.0.1"}, hosts...) {
		addr := h // a host name: PostgreSQL checks it both ways in DNS
		if ip := net.ParseIP(h); ip != nil {
			bits := 128
			if ip.To4() != nil {
				bits = 32
			}
			addr = fmt.Sprintf("%s/%d", ip, bits)
		}
		if seen[addr] {
			continue
		}
		seen[addr] = true
		fmt.Fprintf(&b, "host all all %s trust\nhost replication all %s trust\n", addr, addr)
	}
	return b.String()
}

func (p *Postgres) writeFile(name, text string) error {
	path := filepath.Join(p.data, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	if p.cred != nil {
		if err := os.Chown(tmp, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return err
		}
	}
	return os.Rename(tmp, path)
}

// Configure writes the settings the manager owns for this member: its
// configuration's parameters, then (winning over a parameter of the same
// name) its listen address, its cluster_name, the primary to stream from
// (none when upstream is ""), and whether new transactions are read-only. They take effect at the
// next start, or Reload (listen_addresses only at a start). The file is
// the member's own: postgresql.conf, which copies and rewinds bring from
// another member, only includes it.
func (p *Postgres) Configure(upstream string, readOnly bool) error {
	conninfo := ""
	if upstream != "" {
		host, port, _ := net.SplitHostPort(upstream)
		conninfo = fmt.Sprintf("host=%s port=%s user=postgres application_name=%s", host, port, p.name)
	}
	ro := "on"
	if !readOnly {
		ro = "off"
	}
	var b strings.Builder
	b.WriteString("# Managed by the patroni-like manager; rewritten at every change.\n")
	keys := make([]string, 0, len(p.params))
	for k := range p.params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(p.params[k], "'", "''"))
	}
	// Last, so that they win over a parameter of the same name: the
	// manager connects to this address, and decides the rest.
	fmt.Fprintf(&b, "listen_addresses = '%s'\ncluster_name = '%s'\nprimary_conninfo = '%s'\ndefault_transaction_read_only = %s\n", p.host, p.name, conninfo, ro)
	return p.writeFile(managerConf, b.String())
}

// SetStandby creates (on) or removes standby.signal: whether the next start
// is in recovery, streaming from primary_conninfo.
func (p *Postgres) SetStandby(on bool) error {
	path := filepath.Join(p.data, "standby.signal")
	if !on {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return p.writeFile("standby.signal", "")
}

// PID returns the postmaster's pid, also its process group's, or 0 when
// it is not running.
func (p *Postgres) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the postmaster is running.
func (p *Postgres) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// Start runs the postmaster and waits until it accepts connections (a
// standby does once it is consistent), for at most the life of ctx.
func (p *Postgres) Start(ctx context.Context) error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return errors.New("postgres is already running")
	}
	log, err := p.openLog("starting postgres on %s", p.Addr())
	if err != nil {
		p.mu.Unlock()
		return err
	}
	// Not CommandContext: the server outlives Start's ctx.
	cmd := p.command(context.Background(), "postgres", "-D", p.data, "-p", strconv.Itoa(p.port))
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Start()
	log.Close()
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("start postgres: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
		p.mu.Lock()
		if p.cmd == cmd {
			p.cmd = nil
		}
		p.mu.Unlock()
	}()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, p.DSN())
		if err == nil {
			conn.Close(cctx)
			cancel()
			return nil
		}
		cancel()
		select {
		case <-done:
			return fmt.Errorf("postgres exited while starting; see %s", p.logf)
		case <-ctx.Done():
			p.Stop(0)
			return fmt.Errorf("postgres not accepting connections: %w (last: %v); see %s", ctx.Err(), err, p.logf)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop stops the postmaster and waits for it to exit. With grace 0 it is an
// immediate shutdown (SIGQUIT: every backend exits at once, open
// transactions are lost, the next start runs crash recovery): the fence.
// Otherwise a fast shutdown (SIGINT), escalated to SIGKILL after grace.
func (p *Postgres) Stop(grace time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	sig := syscall.SIGQUIT
	if grace > 0 {
		sig = syscall.SIGINT
	} else {
		grace = 5 * time.Second
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// Fence stops the postmaster as a primary's term ends and reports whether
// the clean part finished within drain.
//
// It starts with a fast shutdown (SIGINT): the postmaster accepts no new
// connection and ends every session at once, so nothing commits from here
// on, and then it writes its last WAL, a shutdown checkpoint included, and
// its WAL senders stream all of it and wait until each connected standby
// has confirmed it. An acknowledged commit therefore reaches the standbys,
// which an immediate shutdown (SIGQUIT) does not promise: it ends the WAL
// senders at once, with whatever they had not sent yet. If that clean part
// has not finished within drain (a standby unreachable, a slow checkpoint),
// Fence escalates to an immediate shutdown, and to SIGKILL of the
// postmaster's process group 5 s after that. With drain 0 it is an
// immediate shutdown from the start.
//
// The clean part has finished when the postmaster has exited, or, before
// that, when its checkpointer has exited, no WAL sender is left and the
// control file says "shut down" (the shutdown checkpoint is written and
// every connected standby has confirmed it). Fence then SIGKILLs the
// postmaster's process group, which loses nothing. It does not wait for
// the exit: a postmaster that is shutting down forks a process to refuse
// each client that connects, and waits for those to exit before it does
// (PostgreSQL 15; an immediate shutdown too, up to 5 s). Under clients
// that keep reconnecting, as applications do during a failover, its exit
// comes well after the WAL is safe; a client that connects and sends
// nothing holds it up for authentication_timeout (60 s).
func (p *Postgres) Fence(drain time.Duration) (drained bool) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false // exited on its own: nothing to drain
	default:
	}
	if drain > 0 {
		pm := cmd.Process.Pid
		ckpt := childNamed(pm, "checkpointer") // 0: the clean part is told by the exit only
		_ = cmd.Process.Signal(syscall.SIGINT)
		t := time.NewTimer(drain)
		defer t.Stop()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return true
			case <-t.C:
				p.Stop(0)
				return false
			case <-tick.C:
				if ckpt != 0 && p.cleanlyShutDown(pm, ckpt) {
					// Nothing is left to write or to send: what remains
					// waits for clients (see above), and an immediate
					// shutdown waits for them too, up to 5 s.
					_ = syscall.Kill(-pm, syscall.SIGKILL)
					<-done
					return true
				}
			}
		}
	}
	p.Stop(0)
	return false
}

// cleanlyShutDown reports whether postmaster pm, in a fast shutdown, has
// finished its clean part: its checkpointer (ckpt) has exited after the
// shutdown checkpoint, no WAL sender of it is left, and the control file
// says "shut down".
func (p *Postgres) cleanlyShutDown(pm, ckpt int) bool {
	kids, ok := children(pm)
	if !ok {
		return false
	}
	for _, c := range kids {
		if c == ckpt || strings.Contains(cmdline(c), "walsender") {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	f, err := p.Control(ctx)
	return err == nil && f["Database cluster state"] == "shut down"
}

// children lists the processes whose parent is pid (Linux: /proc), and
// whether it could.
func children(pid int) ([]int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return nil, false
	}
	var kids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			kids = append(kids, n)
		}
	}
	return kids, true
}

// cmdline is the command line of process pid, as PostgreSQL's process
// titles rewrite it ("postgres: checkpointer", "postgres: walsender ...").
func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// childNamed returns the child of pid whose command line has name in it,
// or 0.
func childNamed(pid int, name string) int {
	kids, _ := children(pid)
	for _, c := range kids {
		if strings.Contains(cmdline(c), name) {
			return c
		}
	}
	return 0
}

// Reload makes the postmaster re-read its configuration files (SIGHUP).
func (p *Postgres) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("postgres is not running")
	}
	return p.cmd.Process.Signal(syscall.SIGHUP)
}

// Connect opens a connection to database postgres.
func (p *Postgres) Connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, p.DSN())
}
