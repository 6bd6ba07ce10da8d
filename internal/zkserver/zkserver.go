// Package zkserver runs real Apache ZooKeeper servers as child processes for
// tenure's tests: a standalone server or a quorum ensemble, every server on
// free 127.0.0.1 ports and with its own data directory, started from the jars
// of Debian's zookeeper package (scripts/test.sh, run by `make test`, installs
// it).
//
// The servers are java processes that die with the test process (they get
// SIGKILL when it exits, however it exits), so no server outlives a test run.
// Each server writes its log, at level WARN, to a file in its own directory,
// never to the test output.
package zkserver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/internal/testnet"
)

// JavaDir is the directory holding the jars of Debian's zookeeper package
// and of its dependencies.
const JavaDir = "/usr/share/java"

// jars are the jars, in JavaDir, on the server's class path: the server and
// its wire format (zookeeper, zookeeper-jute), its logging
// (slf4j-api bound to log4j 1.2 through slf4j-log4j12, as Debian's package
// does), and the libraries the server itself loads (netty, jackson,
// commons-cli, commons-io, dropwizard metrics-core and snappy-java). The
// manifest of Debian's zookeeper.jar names most of these too, plus jetty
// (only for the admin server, which is off here) and jline (only for the
// command-line client, and not installed).
var jars = []string{
	"zookeeper.jar",
	"zookeeper-jute.jar",
	"slf4j-api.jar",
	"slf4j-log4j12.jar",
	"log4j-1.2.jar",
	"netty-buffer.jar",
	"netty-codec.jar",
	"netty-common.jar",
	"netty-handler.jar",
	"netty-resolver.jar",
	"netty-transport.jar",
	"netty-transport-native-epoll.jar",
	"netty-transport-native-unix-common.jar",
	"jackson-annotations.jar",
	"jackson-core.jar",
	"jackson-databind.jar",
	"commons-cli.jar",
	"commons-io.jar",
	"metrics-core.jar",
	"snappy-java.jar",
}

// Classpath returns the absolute paths of the jars a server runs with (in
// JavaDir): zookeeper and zookeeper-jute, slf4j-api bound to log4j 1.2, netty,
// jackson, commons-cli, commons-io, metrics-core and snappy-java. A Java
// client, such as Curator, needs the same jars next to its own.
func Classpath() []string {
	cp := make([]string, len(jars))
	for i, j := range jars {
		cp[i] = filepath.Join(JavaDir, j)
	}
	return cp
}

// MainClass is the class every server runs; with a single server it falls
// back to ZooKeeper's standalone mode.
const MainClass = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

// Defaults of Options.
const (
	// DefaultTickTime is the default Options.TickTime, ZooKeeper's basic time
	// unit (ZooKeeper's own default is 2 s).
	DefaultTickTime = 100 * time.Millisecond
	// DefaultStartTimeout is the default Options.StartTimeout.
	DefaultStartTimeout = 60 * time.Second
)

// Options configures Start. The zero value is one standalone server with a
// 100 ms tick.
type Options struct {
	// Servers is the number of servers: 1 (the default, when 0) runs a
	// standalone server, more run a quorum ensemble on loopback (use an odd
	// number, such as 3, so that it survives the loss of a server).
	Servers int
	// TickTime is ZooKeeper's tickTime, the unit of its heartbeats and
	// timeouts; it is rounded down to whole milliseconds. Default 100 ms.
	// initLimit is 20 ticks and syncLimit 10 ticks.
	TickTime time.Duration
	// MinSessionTimeout is the shortest session timeout the servers grant
	// (a client asking for less gets this). Default 2×TickTime, as in
	// ZooKeeper.
	MinSessionTimeout time.Duration
	// MaxSessionTimeout is the longest session timeout the servers grant (a
	// client asking for more gets this). Default 20×TickTime, as in
	// ZooKeeper.
	MaxSessionTimeout time.Duration
	// StartTimeout bounds how long Start waits for the servers to serve, and
	// Restart for a server to come back. Default 60 s.
	StartTimeout time.Duration
	// Partitionable, for an ensemble, routes every link from one server to
	// another (quorum and leader election alike, one proxy per direction)
	// through a TCP proxy in the calling process, so that Isolate can cut a
	// server off from the others while its clients still reach it. Each
	// server's zoo.cfg then names the others by their proxies' ports.
	// Default false: the servers talk directly.
	Partitionable bool
}

func (o Options) withDefaults() (Options, error) {
	if o.Servers == 0 {
		o.Servers = 1
	}
	if o.Servers < 0 {
		return o, fmt.Errorf("zkserver: Servers = %d, want at least 1", o.Servers)
	}
	if o.TickTime == 0 {
		o.TickTime = DefaultTickTime
	}
	if o.TickTime < time.Millisecond {
		return o, fmt.Errorf("zkserver: TickTime = %v, want at least 1ms", o.TickTime)
	}
	o.TickTime = o.TickTime.Truncate(time.Millisecond)
	if o.MinSessionTimeout == 0 {
		o.MinSessionTimeout = 2 * o.TickTime
	}
	if o.MaxSessionTimeout == 0 {
		o.MaxSessionTimeout = 20 * o.TickTime
	}
	if o.MinSessionTimeout < 0 || o.MaxSessionTimeout < o.MinSessionTimeout {
		return o, fmt.Errorf("zkserver: session timeouts [%v, %v] are not a range", o.MinSessionTimeout, o.MaxSessionTimeout)
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = DefaultStartTimeout
	}
	return o, nil
}

// Installed reports whether Start can run: nil if java is on PATH and the
// jars of Classpath are present, else an error that says what is missing
// and to run `make test`, which installs it.
func Installed() error {
	var missing []string
	if _, err := exec.LookPath("java"); err != nil {
		missing = append(missing, "java (on PATH)")
	}
	for _, j := range Classpath() {
		if _, err := os.Stat(j); err != nil {
			missing = append(missing, j)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("zkserver: ZooKeeper is not installed (missing %s): run `make test`, which installs Debian's zookeeper package",
			strings.Join(missing, ", "))
	}
	return nil
}

// Ensemble is a set of running ZooKeeper servers, indexed from 0 (server i
// has myid i+1). Its methods are safe for concurrent use. Stop it with Close.
type Ensemble struct {
	dir  string
	opts Options

	mu      sync.Mutex
	servers []*server
	closed  bool
	// links[i][j] are the proxies server i reaches server j through (quorum,
	// election), with Options.Partitionable; nil otherwise.
	links [][][2]*faultproxy.Proxy
}

type server struct {
	index        int
	dir          string // holds zoo.cfg, log4j.properties, zookeeper.log, data/
	clientPort   int
	quorumPort   int // ensembles only
	electionPort int // ensembles only

	cmd  *exec.Cmd     // nil when not running
	done chan struct{} // closed when cmd has exited
}

func (s *server) endpoint() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.clientPort)) }
func (s *server) logPath() string  { return filepath.Join(s.dir, "zookeeper.log") }

func (s *server) running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Start runs opts.Servers ZooKeeper servers under dir, server i in
// dir/zk<i+1> (its zoo.cfg, log4j.properties, log zookeeper.log and data
// directory data/), all on free 127.0.0.1 ports. dir is created if needed; if
// it is "", Start makes a new temporary directory. It returns once every
// server answers `ruok` with `imok` and serves (`srvr` reports its mode) and,
// for an ensemble, one of them is the leader; it fails after
// opts.StartTimeout (default 60 s) with the tail of the logs of the servers
// that were not ready. Close never removes dir.
func Start(dir string, opts Options) (*Ensemble, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := Installed(); err != nil {
		return nil, err
	}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "zkserver-"); err != nil {
			return nil, fmt.Errorf("zkserver: %w", err)
		}
	} else if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("zkserver: %w", err)
	}
	// Free ports are found by binding port 0 and letting go; something else
	// may take one before the server binds it, so on a bind failure start
	// over on other ports.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		e, err := start(dir, opts)
		if err == nil {
			return e, nil
		}
		if attempt == attempts || !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
}

var errPortTaken = errors.New("port already in use")

func start(dir string, opts Options) (*Ensemble, error) {
	n := opts.Servers
	perServer := 1
	if n > 1 {
		perServer = 3
	}
	ports, err := testnet.FreePorts(n * perServer)
	if err != nil {
		return nil, err
	}
	e := &Ensemble{dir: dir, opts: opts}
	for i := 0; i < n; i++ {
		s := &server{index: i, dir: filepath.Join(dir, fmt.Sprintf("zk%d", i+1)), clientPort: ports[i*perServer]}
		if n > 1 {
			s.quorumPort, s.electionPort = ports[i*perServer+1], ports[i*perServer+2]
		}
		e.servers = append(e.servers, s)
	}
	if opts.Partitionable && n > 1 {
		if err := e.openLinks(); err != nil {
			return nil, err
		}
	}
	for _, s := range e.servers {
		// A previous attempt's files would only confuse: start afresh.
		if err := os.RemoveAll(s.dir); err != nil {
			return nil, fmt.Errorf("zkserver: %w", err)
		}
		if err := e.writeConfig(s); err != nil {
			e.closeLinks()
			return nil, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.servers {
		if err := e.launch(s); err != nil {
			e.killAllLocked()
			e.closeLinks()
			return nil, err
		}
	}
	if err := e.waitLocked(e.servers, true); err != nil {
		e.killAllLocked()
		e.closeLinks()
		return nil, err
	}
	return e, nil
}

// openLinks starts the proxies of Options.Partitionable: one per ordered
// pair of servers and port.
func (e *Ensemble) openLinks() error {
	e.links = make([][][2]*faultproxy.Proxy, len(e.servers))
	for i := range e.servers {
		e.links[i] = make([][2]*faultproxy.Proxy, len(e.servers))
		for j, o := range e.servers {
			if i == j {
				continue
			}
			for k, port := range []int{o.quorumPort, o.electionPort} {
				p, err := faultproxy.New(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
				if err != nil {
					e.closeLinks()
					return fmt.Errorf("zkserver: %w", err)
				}
				// A server opens its quorum port when it becomes the
				// leader, and its followers connect at once: they must
				// wait for it, as without a proxy they would retry.
				p.RetryDial(time.Second)
				e.links[i][j][k] = p
			}
		}
	}
	return nil
}

func (e *Ensemble) closeLinks() {
	for _, row := range e.links {
		for _, pair := range row {
			for _, p := range pair {
				if p != nil {
					_ = p.Close()
				}
			}
		}
	}
	e.links = nil
}

// peerPorts returns the quorum and election ports server s reaches server o
// at: o's own, or the proxies' of Options.Partitionable.
func (e *Ensemble) peerPorts(s, o *server) (quorum, election int) {
	if e.links == nil || s == o {
		return o.quorumPort, o.electionPort
	}
	pair := e.links[s.index][o.index]
	port := func(p *faultproxy.Proxy) int {
		_, ps, _ := net.SplitHostPort(p.Addr())
		n, _ := strconv.Atoi(ps)
		return n
	}
	return port(pair[0]), port(pair[1])
}

// Isolate cuts server i off from every other server of an ensemble started
// with Options.Partitionable: the links between them, both ways, drop every
// byte without closing (as a network partition does), while server i's
// clients still reach it. It lasts until Rejoin.
func (e *Ensemble) Isolate(i int) error { return e.setLinks(i, true) }

// Rejoin ends Isolate(i): the links carry bytes again (the connections
// that lost bytes are closed, and the servers reconnect).
func (e *Ensemble) Rejoin(i int) error { return e.setLinks(i, false) }

func (e *Ensemble) setLinks(i int, cut bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.server(i); err != nil {
		return err
	}
	if e.links == nil {
		return errors.New("zkserver: the ensemble was not started with Options.Partitionable")
	}
	for j := range e.servers {
		if j == i {
			continue
		}
		for _, p := range append(e.links[i][j][:], e.links[j][i][:]...) {
			if cut {
				p.Blackhole()
			} else {
				p.Heal()
			}
		}
	}
	return nil
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

func (e *Ensemble) writeConfig(s *server) error {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return fmt.Errorf("zkserver: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by tenure's internal/zkserver.\n")
	fmt.Fprintf(&b, "tickTime=%d\n", ms(e.opts.TickTime))
	fmt.Fprintf(&b, "initLimit=20\nsyncLimit=10\n")
	fmt.Fprintf(&b, "minSessionTimeout=%d\nmaxSessionTimeout=%d\n", ms(e.opts.MinSessionTimeout), ms(e.opts.MaxSessionTimeout))
	fmt.Fprintf(&b, "dataDir=%s\n", data)
	fmt.Fprintf(&b, "clientPortAddress=127.0.0.1\nclientPort=%d\n", s.clientPort)
	// No limit on connections per client address: every test client comes
	// from 127.0.0.1 (ZooKeeper's default is 60).
	fmt.Fprintf(&b, "maxClientCnxns=0\n")
	// The rest become zookeeper.* system properties.
	fmt.Fprintf(&b, "4lw.commands.whitelist=*\n")
	fmt.Fprintf(&b, "admin.enableServer=false\n")
	// Test data need not survive a machine crash; fsync only slows tests.
	fmt.Fprintf(&b, "forceSync=no\n")
	// Preallocate transaction logs 4 MB at a time, not 64 MB.
	fmt.Fprintf(&b, "preAllocSize=4096\n")
	// A follower killed before its first snapshot has transaction logs and
	// no snapshot, which ZooKeeper refuses at startup unless told that an
	// empty snapshot is fine.
	fmt.Fprintf(&b, "snapshot.trust.empty=true\n")
	if len(e.servers) > 1 {
		for _, o := range e.servers {
			q, el := e.peerPorts(s, o)
			fmt.Fprintf(&b, "server.%d=127.0.0.1:%d:%d\n", o.index+1, q, el)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(fmt.Sprintf("%d\n", s.index+1)), 0o644); err != nil {
			return fmt.Errorf("zkserver: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.dir, "zoo.cfg"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("zkserver: %w", err)
	}
	log4j := strings.Join([]string{
		"log4j.rootLogger=WARN, FILE",
		"log4j.appender.FILE=org.apache.log4j.FileAppender",
		"log4j.appender.FILE.File=" + s.logPath(),
		"log4j.appender.FILE.Append=true",
		"log4j.appender.FILE.layout=org.apache.log4j.PatternLayout",
		"log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n",
		"",
	}, "\n")
	if err := os.WriteFile(filepath.Join(s.dir, "log4j.properties"), []byte(log4j), 0o644); err != nil {
		return fmt.Errorf("zkserver: %w", err)
	}
	return nil
}

// launch starts s's java process; e.mu is held.
func (e *Ensemble) launch(s *server) error {
	java, err := exec.LookPath("java")
	if err != nil {
		return fmt.Errorf("zkserver: %w", err)
	}
	log, err := os.OpenFile(s.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("zkserver: %w", err)
	}
	defer log.Close() // the child has its own descriptor
	fmt.Fprintf(log, "==== zkserver: starting server %d (myid %d) at %s\n", s.index, s.index+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(java,
		"-Xmx256m", "-XX:+UseSerialGC", "-XX:-UsePerfData",
		"-Djava.awt.headless=true",
		"-Djava.net.preferIPv4Stack=true",
		"-Dlog4j.configuration=file:"+filepath.Join(s.dir, "log4j.properties"),
		"-Dzookeeper.jmx.log4j.disable=true",
		"-cp", strings.Join(Classpath(), string(os.PathListSeparator)),
		MainClass, filepath.Join(s.dir, "zoo.cfg"))
	cmd.Dir = s.dir
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("zkserver: start server %d: %w", s.index, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // killed servers exit with an error, which says nothing
		close(done)
	}()
	s.cmd, s.done = cmd, done
	return nil
}

// waitLocked waits until every server of ss answers imok and serves, and, if
// needLeader, one server of the ensemble leads (or, alone, is standalone).
// e.mu is held.
func (e *Ensemble) waitLocked(ss []*server, needLeader bool) error {
	deadline := time.Now().Add(e.opts.StartTimeout)
	for {
		var notReady []*server
		noLeader := false
		for _, s := range ss {
			select {
			case <-s.done:
				tail := testnet.LogTail(s.logPath(), 0)
				err := fmt.Errorf("zkserver: server %d (%s) exited while starting; tail of %s:\n%s", s.index, s.endpoint(), s.logPath(), tail)
				if strings.Contains(tail, "Address already in use") {
					err = fmt.Errorf("%w: %w", errPortTaken, err)
				}
				return err
			default:
			}
			if r, err := fourLetterWord(s.endpoint(), "ruok", time.Second); err != nil || r != "imok" {
				notReady = append(notReady, s)
				continue
			}
			if mode, err := srvrMode(s.endpoint(), time.Second); err != nil || mode == "" {
				notReady = append(notReady, s)
			}
		}
		if len(notReady) == 0 {
			if !needLeader {
				return nil
			}
			if _, err := e.leaderLocked(); err == nil {
				return nil
			}
			notReady, noLeader = ss, true
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			fmt.Fprintf(&b, "zkserver: %d-server ensemble not ready after %v", len(e.servers), e.opts.StartTimeout)
			if noLeader {
				fmt.Fprintf(&b, " (all serving, none leads)")
			}
			for _, s := range notReady {
				fmt.Fprintf(&b, "\n-- server %d (%s), tail of %s:\n%s", s.index, s.endpoint(), s.logPath(), testnet.LogTail(s.logPath(), 0))
			}
			return errors.New(b.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Dir is the directory Start ran the servers under.
func (e *Ensemble) Dir() string { return e.dir }

// Len is the number of servers, running or not.
func (e *Ensemble) Len() int { return len(e.servers) }

// Endpoints returns the client addresses ("127.0.0.1:port") of all servers,
// running or not, in index order.
func (e *Ensemble) Endpoints() []string {
	out := make([]string, len(e.servers))
	for i, s := range e.servers {
		out[i] = s.endpoint()
	}
	return out
}

// Endpoint returns the client address ("127.0.0.1:port") of server i. It
// panics if i is out of range.
func (e *Ensemble) Endpoint(i int) string { return e.servers[i].endpoint() }

// LogFile returns the path of server i's log file. It panics if i is out of
// range.
func (e *Ensemble) LogFile(i int) string { return e.servers[i].logPath() }

// Leader returns the index of the server whose `srvr` reports "Mode: leader"
// or, for a single server, "Mode: standalone". It asks the running servers
// once, without waiting, and fails if none leads.
func (e *Ensemble) Leader() (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leaderLocked()
}

func (e *Ensemble) leaderLocked() (int, error) {
	var modes []string
	for _, s := range e.servers {
		if !s.running() {
			modes = append(modes, fmt.Sprintf("%d: stopped", s.index))
			continue
		}
		mode, err := srvrMode(s.endpoint(), time.Second)
		switch {
		case err != nil:
			modes = append(modes, fmt.Sprintf("%d: %v", s.index, err))
		case mode == "":
			modes = append(modes, fmt.Sprintf("%d: not serving", s.index))
		case mode == "leader" || mode == "standalone":
			return s.index, nil
		default:
			modes = append(modes, fmt.Sprintf("%d: %s", s.index, mode))
		}
	}
	return -1, fmt.Errorf("zkserver: no leader (%s)", strings.Join(modes, "; "))
}

func (e *Ensemble) server(i int) (*server, error) {
	if i < 0 || i >= len(e.servers) {
		return nil, fmt.Errorf("zkserver: no server %d in a %d-server ensemble", i, len(e.servers))
	}
	if e.closed {
		return nil, errors.New("zkserver: ensemble closed")
	}
	return e.servers[i], nil
}

// Mode returns what server i's `srvr` answer says it is ("leader",
// "follower", "standalone"), or "" while it does not serve clients (a
// server looking for a leader, or stopped). It asks once, without waiting.
func (e *Ensemble) Mode(i int) string {
	e.mu.Lock()
	s, err := e.server(i)
	e.mu.Unlock()
	if err != nil {
		return ""
	}
	mode, _ := srvrMode(s.endpoint(), time.Second)
	return mode
}

// Pid returns the process id of server i, or an error when it is not
// running. Safe for concurrent use.
func (e *Ensemble) Pid(i int) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.server(i)
	if err != nil {
		return 0, err
	}
	if !s.running() {
		return 0, fmt.Errorf("zkserver: server %d is not running", i)
	}
	return s.cmd.Process.Pid, nil
}

// Sessions returns the ids of the sessions whose clients are connected to
// server i now, from its `cons` answer. It asks once, without waiting.
func (e *Ensemble) Sessions(i int) ([]int64, error) {
	e.mu.Lock()
	s, err := e.server(i)
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r, err := fourLetterWord(s.endpoint(), "cons", time.Second)
	if err != nil {
		return nil, fmt.Errorf("zkserver: cons on server %d: %w", i, err)
	}
	var ids []int64
	for _, line := range strings.Split(r, "\n") {
		_, rest, ok := strings.Cut(line, "sid=0x")
		if !ok {
			continue
		}
		hex, _, _ := strings.Cut(rest, ",")
		id, err := strconv.ParseUint(strings.TrimRight(hex, ")"), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("zkserver: cons on server %d: %q: %w", i, line, err)
		}
		ids = append(ids, int64(id))
	}
	return ids, nil
}

// Kill sends SIGKILL to server i and waits for it to exit. Its data stay, for
// Restart. It fails if the server is not running.
func (e *Ensemble) Kill(i int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.server(i)
	if err != nil {
		return err
	}
	if !s.running() {
		return fmt.Errorf("zkserver: server %d is not running", i)
	}
	e.refuseLinksTo(i)
	s.kill()
	return nil
}

// refuseLinksTo makes the proxies of Options.Partitionable that lead to
// server i refuse connections, as its host does while it is down: a proxy
// that accepted and then closed would make the other servers believe they
// had sent it their leader-election votes, and wait seconds for answers
// (2.5–7 s to elect a new leader after a kill, against 0.4 s without
// proxies). e.mu is held.
func (e *Ensemble) refuseLinksTo(i int) {
	for j := range e.links {
		if j != i {
			for _, p := range e.links[j][i] {
				p.Refuse()
			}
		}
	}
}

// listenLinksTo ends refuseLinksTo(i). e.mu is held.
func (e *Ensemble) listenLinksTo(i int) error {
	for j := range e.links {
		if j != i {
			for _, p := range e.links[j][i] {
				if err := p.Listen(); err != nil {
					return fmt.Errorf("zkserver: link from server %d to server %d: %w", j, i, err)
				}
			}
		}
	}
	return nil
}

func (s *server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // fails only if it already exited
	<-s.done
	s.cmd = nil
}

// Restart starts server i again with the same configuration, ports and data,
// killing it first if it is still running. It waits until the server answers
// imok and, if a quorum of the ensemble's servers is then running, until it
// serves; it fails after Options.StartTimeout (default 60 s).
func (e *Ensemble) Restart(i int) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, err := e.server(i)
	if err != nil {
		return err
	}
	e.refuseLinksTo(i)
	s.kill()
	if err := e.listenLinksTo(i); err != nil {
		return err
	}
	if err := e.launch(s); err != nil {
		return err
	}
	running := 0
	for _, o := range e.servers {
		if o.running() {
			running++
		}
	}
	if running > len(e.servers)/2 {
		return e.waitLocked([]*server{s}, false)
	}
	deadline := time.Now().Add(e.opts.StartTimeout)
	for {
		if r, err := fourLetterWord(s.endpoint(), "ruok", time.Second); err == nil && r == "imok" {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("zkserver: server %d exited while restarting; tail of %s:\n%s", i, s.logPath(), testnet.LogTail(s.logPath(), 0))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("zkserver: server %d not answering imok after %v; tail of %s:\n%s", i, e.opts.StartTimeout, s.logPath(), testnet.LogTail(s.logPath(), 0))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Close kills every server and waits for them to exit. It is idempotent and
// leaves Dir in place.
func (e *Ensemble) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.killAllLocked()
	e.closeLinks()
	e.closed = true
}

func (e *Ensemble) killAllLocked() {
	for _, s := range e.servers {
		if s.cmd != nil {
			_ = s.cmd.Process.Kill()
		}
	}
	for _, s := range e.servers {
		s.kill()
	}
}

// fourLetterWord sends ZooKeeper four-letter word cmd to addr and returns the
// whole answer.
func fourLetterWord(addr, cmd string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// srvrMode returns the Mode line of addr's `srvr` answer ("leader",
// "follower", "standalone", ...), or "" if the server is not serving.
func srvrMode(addr string, timeout time.Duration) (string, error) {
	r, err := fourLetterWord(addr, "srvr", timeout)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(strings.NewReader(r))
	for sc.Scan() {
		if m, ok := strings.CutPrefix(sc.Text(), "Mode: "); ok {
			return strings.TrimSpace(m), nil
		}
	}
	return "", nil
}
