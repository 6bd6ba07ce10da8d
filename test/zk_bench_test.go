package test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

// zkSessionTimeout is every ZooKeeper contender's session timeout (tenure's
// TTL).
const zkSessionTimeout = 10 * time.Second

// zkWarmup is the number of untimed, unrecorded handoffs every
// ZooKeeper run makes once all contenders are queued and before the timed
// ones. The JVM needs it: cold, Curator's first few hundred handoffs
// run 2-3 times slower while the JIT compiles them. Every implementation
// gets the same warm-up, so that all are measured in the same steady state.
var zkWarmup = flag.Int("zkbench.warmup", 300, "untimed handoffs before the timed ones in BenchmarkZKHandoff")

// zkCount is the number of timed handoffs of every BenchmarkZKHandoff run
// below 1,000 contenders (-zkbench.count; 0: -benchtime's count). Every
// ZooKeeper implementation hands off hundreds of times a second, so more
// samples than the etcd peers' 300 (about 20 a second at 2 contenders)
// cost seconds, and p99, the value with 1 % of the samples above it,
// stops resting on the few largest ones.
var zkCount = flag.Int("zkbench.count", 0, "timed handoffs per BenchmarkZKHandoff run below 1,000 contenders (0: -benchtime's count)")

// zkTimedCount is timedCount with -zkbench.count.
func zkTimedCount(b *testing.B, n int) int {
	if n < bigRun && *zkCount > 0 {
		return *zkCount
	}
	return timedCount(b, n)
}

// maxDriverContenders is the most contenders a driver (Curator, kazoo) runs
// with; larger runs are skipped, saying so.
var maxDriverContenders = 1000

// zkImpl is one lock implementation on ZooKeeper. In-process ones build
// contenders (each on its own connection and session, as a separate
// process would be); the others are a driver program that runs the
// contenders itself (see testdata/zkbench).
type zkImpl struct {
	name string
	// new builds the contender with index i for key (in-process
	// implementations), connecting with dial.
	new func(ctx context.Context, key string, i int, dial zk.Dialer) (contender, error)
	// command returns the driver's argv for n contenders, warm warm-up
	// handoffs and count timed ones, or an error saying why it cannot run
	// here (the sub-benchmark is then skipped).
	command func(key string, n, warm, count int) ([]string, error)
}

var zkImpls = []zkImpl{
	{name: "tenure", new: newZKTenure},
	{name: "gozk-lock", new: newGoZKLock},
	{name: "curator", command: curatorCommand},
	{name: "kazoo", command: kazooCommand},
}

// zkTenureContender campaigns with tenure's election.Elector on its own
// zkelect.Backend.
type zkTenureContender struct {
	b *zkelect.Backend
	e *election.Elector
}

// zkRecords, when 0 or more, sets tenure's zkelect.WithHandoverRecords in
// BenchmarkZKHandoff (0: records off), to measure what they change.
var zkRecords = flag.Int("zkbench.records", -1, "tenure's zkelect.WithHandoverRecords in BenchmarkZKHandoff (-1: the package default, 0: off)")

func newZKTenure(ctx context.Context, key string, i int, dial zk.Dialer) (contender, error) {
	opts := []zkelect.Option{zkelect.WithDialer(dial)}
	if *zkRecords >= 0 {
		opts = append(opts, zkelect.WithHandoverRecords(*zkRecords))
	}
	b, err := zkelect.Dial(ctx, zkEndpoints, zkSessionTimeout, opts...)
	if err != nil {
		return nil, err
	}
	e, err := election.New(b, election.Config{Key: key, Identity: fmt.Sprint(i), TTL: zkSessionTimeout})
	if err != nil {
		b.Close()
		return nil, err
	}
	return &zkTenureContender{b, e}, nil
}

func (c *zkTenureContender) campaign(ctx context.Context) error {
	_, err := c.e.Campaign(ctx)
	return err
}
func (c *zkTenureContender) resign(ctx context.Context) error { return c.e.Resign(ctx) }
func (c *zkTenureContender) close(ctx context.Context) error {
	err := c.e.Close(ctx)
	c.b.Close() // ends the session: its nodes go with it
	return err
}

// goZKContender locks with go-zookeeper's own zk.Lock on its own *zk.Conn.
// zk.Lock takes no context: a campaign whose ctx ends closes the
// connection, which fails the Lock call.
type goZKContender struct {
	conn      *zk.Conn
	lock      *zk.Lock
	closeOnce sync.Once
}

func newGoZKLock(ctx context.Context, key string, _ int, dial zk.Dialer) (contender, error) {
	conn, err := zkConnectWith(ctx, dial)
	if err != nil {
		return nil, err
	}
	return &goZKContender{conn: conn, lock: zk.NewLock(conn, key, zk.WorldACL(zk.PermAll))}, nil
}

// shut closes the connection once; a concurrent caller waits until the
// first call has ended the session (Conn.Close waits for the server's
// answer to its close request, up to 1 s).
func (c *goZKContender) shut() { c.closeOnce.Do(c.conn.Close) }

func (c *goZKContender) campaign(ctx context.Context) error {
	stop := context.AfterFunc(ctx, c.shut)
	defer stop()
	err := c.lock.Lock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
func (c *goZKContender) resign(context.Context) error { return c.lock.Unlock() }
func (c *goZKContender) close(context.Context) error  { c.shut(); return nil }

// zkNopLogger silences go-zookeeper's connection messages.
type zkNopLogger struct{}

func (zkNopLogger) Printf(string, ...any) {}

// zkConnect opens a go-zookeeper connection with the benchmarks' session
// timeout and waits until it has a session.
func zkConnect(ctx context.Context) (*zk.Conn, error) { return zkConnectWith(ctx, net.DialTimeout) }

// zkConnectWith is zkConnect through dial.
func zkConnectWith(ctx context.Context, dial zk.Dialer) (*zk.Conn, error) {
	conn, ev, err := zk.Connect(zkEndpoints, zkSessionTimeout, zk.WithLogger(zkNopLogger{}), zk.WithDialer(dial))
	if err != nil {
		return nil, err
	}
	for conn.State() != zk.StateHasSession {
		select {
		case <-ev: // go-zookeeper drops events when nobody reads them
		case <-ctx.Done():
			conn.Close()
			return nil, fmt.Errorf("zookeeper %v: no session: %w", zkEndpoints, ctx.Err())
		}
	}
	return conn, nil
}

// curatorJars are the jars, in zkserver.JavaDir, that CuratorHandoff.java
// runs with besides ZooKeeper's (zkserver.Classpath): Curator, the Guava it
// uses, and slf4j's simple binding (to stderr) instead of the server's
// log4j one.
var curatorJars = []string{"curator-client.jar", "curator-framework.jar", "curator-recipes.jar", "guava.jar", "slf4j-simple.jar"}

func curatorCommand(key string, n, warm, count int) ([]string, error) {
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("curator: no java on PATH: %w", err)
	}
	var cp []string
	for _, j := range zkserver.Classpath() {
		switch filepath.Base(j) {
		case "slf4j-log4j12.jar", "log4j-1.2.jar":
			continue
		}
		cp = append(cp, j)
	}
	for _, j := range curatorJars {
		cp = append(cp, filepath.Join(zkserver.JavaDir, j))
	}
	for _, j := range cp {
		if _, err := os.Stat(j); err != nil {
			return nil, fmt.Errorf("curator: %w (Debian's libcurator-recipes-java and zookeeper packages provide the jars)", err)
		}
	}
	return []string{java,
		"-XX:+UseSerialGC", "-Xmx512m",
		"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
		// Closing a client logs a harmless EndOfStreamException at WARN.
		"-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.ClientCnxn=error",
		"-cp", strings.Join(cp, string(os.PathListSeparator)),
		filepath.Join("testdata", "zkbench", "CuratorHandoff.java"), // Java's single-file source launcher
		strings.Join(zkEndpoints, ","), key, strconv.Itoa(n), strconv.Itoa(warm), strconv.Itoa(count),
		strconv.FormatInt(zkSessionTimeout.Milliseconds(), 10),
	}, nil
}

var (
	kazooOnce   sync.Once
	kazooPython string
	kazooErr    error
)

func kazooCommand(key string, n, warm, count int) ([]string, error) {
	kazooOnce.Do(func() {
		// Debian's python3-kazoo is installed for Debian's python3, which
		// need not be the python3 first on PATH.
		for _, py := range []string{"/usr/bin/python3", "python3"} {
			p, err := exec.LookPath(py)
			if err != nil {
				continue
			}
			if exec.Command(p, "-c", "import kazoo.client").Run() == nil {
				kazooPython = p
				return
			}
		}
		kazooErr = errors.New("kazoo: no python3 that imports kazoo (Debian's python3-kazoo package provides it)")
	})
	if kazooErr != nil {
		return nil, kazooErr
	}
	return []string{kazooPython, filepath.Join("testdata", "zkbench", "kazoo_handoff.py"),
		strings.Join(zkEndpoints, ","), key, strconv.Itoa(n), strconv.Itoa(warm), strconv.Itoa(count),
		strconv.FormatInt(zkSessionTimeout.Milliseconds(), 10),
	}, nil
}

// BenchmarkZKHandoff measures lock handoff latency on ZooKeeper: the time
// from the moment a holder decides to release (just before it resigns or
// unlocks) until the next holder's campaign or acquire returns. N
// contenders, each on its own connection and session, loop acquire →
// release → acquire, so each releaser joins the back of the queue and the
// queue stays N long. Once all N are queued, zkWarmup (-zkbench.warmup,
// default 300) untimed handoffs run; then the sub-benchmark times
// zkTimedCount of them (-zkbench.count below 1,000 contenders, -bench.big
// from 1,000, b.N otherwise).
//
// Implementations: tenure (zkelect + election.Elector), go-zookeeper's own
// zk.Lock, Curator's InterProcessMutex and kazoo's Lock. Curator and kazoo
// run in a driver program (testdata/zkbench) that measures the latencies
// itself, with the same loop, and prints them; their sub-benchmarks are
// skipped when Java with Curator's jars, or a Python with kazoo, is
// missing.
//
// Metrics: p50-ms and p99-ms are nearest-rank percentiles of the timed
// handoffs' latencies; handoffs/s is their count over the wall time from the first
// timed release to the last acquisition; zk-reqs/handoff is the number of
// requests the ZooKeeper server received during the timed handoffs
// (`srvr`'s Received counter, every client's pings included) per handoff.
// ns/op is the timed wall time per timed handoff (for the drivers, from the
// moment the benchmark reads their "start" line to their "finished" line).
// zk-cpu-us/handoff is the server's CPU time per timed handoff, and for the
// in-process implementations go-cpu-us/handoff this process's; their
// handoffs are also split on the wire (release-us, commit-us, wake-us,
// read-us, elect-us, client-us, requeue-us, split: see wireLog.report).
//
// All implementations run on the package's one ZooKeeper server, back to
// back for each N, in -bench.repeat interleaved rounds. The run fails if two contenders ever hold at once, if no
// handoff happens for 10 s, or if a node is left under the lock path.
func BenchmarkZKHandoff(b *testing.B) {
	if err := warmZKServer(); err != nil {
		b.Fatal(err)
	}
	for _, n := range contenderCounts(b) {
		interleaved(b, n, zkImpls, func(im zkImpl) string { return im.name }, func(b *testing.B, im zkImpl) {
			if im.new != nil {
				benchZKInProcess(b, im, n)
			} else {
				benchZKDriver(b, im, n)
			}
		})
	}
}

var (
	zkWarmOnce sync.Once
	zkWarmErr  error
)

// warmZKServer runs, once per process, some 60,000 requests of the kinds
// the lock recipes send (ephemeral-sequential create, exists and get with
// a watch, children, delete firing the watches) from 8 connections, so
// that the server's JIT has compiled its hot paths before the first
// sub-benchmark. Cold, the server answers the first run (tenure's, at 2
// contenders) about twice as slowly as later ones.
func warmZKServer() error {
	zkWarmOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		key := fmt.Sprintf("/tenure-bench/zk-warm-%d", keySeq.Add(1))
		admin, err := zkConnect(ctx)
		if err != nil {
			zkWarmErr = err
			return
		}
		defer admin.Close()
		for _, p := range []string{"/tenure-bench", key} {
			if _, err := admin.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				zkWarmErr = fmt.Errorf("warm-up: create %s: %w", p, err)
				return
			}
		}
		errs := make([]error, 8)
		var wg sync.WaitGroup
		for w := range errs {
			wg.Go(func() {
				conn, err := zkConnect(ctx)
				if err != nil {
					errs[w] = err
					return
				}
				defer conn.Close()
				for range 1500 {
					p, err := conn.Create(key+"/w-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
					if err == nil {
						_, _, _, err = conn.ExistsW(p)
					}
					if err == nil {
						_, _, err = conn.Children(key)
					}
					if err == nil {
						_, _, _, err = conn.GetW(p)
					}
					if err == nil {
						err = conn.Delete(p, -1)
					}
					if err != nil {
						errs[w] = fmt.Errorf("warm-up: %w", err)
						return
					}
				}
			})
		}
		wg.Wait()
		if zkWarmErr = errors.Join(errs...); zkWarmErr == nil {
			zkWarmErr = admin.Delete(key, -1)
		}
	})
	return zkWarmErr
}

func zkBenchKey(impl string, n int) string {
	return fmt.Sprintf("/tenure-bench/zk-handoff/%s/%d/%d", impl, n, keySeq.Add(1))
}

// checkZKKey fails b if any node is left under key, then deletes key and
// its ancestors that are left empty.
func checkZKKey(b *testing.B, admin *zk.Conn, key string) {
	children, _, err := admin.Children(key)
	switch {
	case errors.Is(err, zk.ErrNoNode):
	case err != nil:
		b.Errorf("children of %s after the run: %v", key, err)
		return
	case len(children) > 0:
		b.Errorf("%d node(s) left under %s after every contender closed: %v", len(children), key, children)
		return
	}
	for p := key; p != "/"; p = path.Dir(p) {
		if err := admin.Delete(p, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
			if !errors.Is(err, zk.ErrNotEmpty) {
				b.Errorf("delete %s: %v", p, err)
			}
			return
		}
	}
}

// zkReceived returns the number of requests the ZooKeeper server has
// received (the Received line of its `srvr` answer).
func zkReceived() (int64, error) {
	c, err := net.DialTimeout("tcp", zkEndpoints[0], time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := io.WriteString(c, "srvr"); err != nil {
		return 0, err
	}
	out, err := io.ReadAll(c)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, "Received: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("no Received line in srvr's answer %q", out)
}

// zkRequests counts the server's received requests over the timed part
// of a run.
type zkRequests struct{ start, n int64 }

func (r *zkRequests) begin(b *testing.B) {
	n, err := zkReceived()
	if err != nil {
		b.Fatalf("srvr: %v", err)
	}
	r.start = n
}

func (r *zkRequests) report(b *testing.B) {
	n, err := zkReceived()
	if err != nil {
		b.Fatalf("srvr: %v", err)
	}
	b.ReportMetric(float64(n-r.start)/float64(r.n), "zk-reqs/handoff")
}

func reportLatencies(b *testing.B, lats []time.Duration, elapsed time.Duration) {
	slices.Sort(lats)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(nearestRank(lats, 50)), "p50-ms")
	b.ReportMetric(ms(nearestRank(lats, 99)), "p99-ms")
	b.ReportMetric(float64(len(lats))/elapsed.Seconds(), "handoffs/s")
	b.ReportMetric(float64(len(lats)), "handoffs")
}

// benchZKInProcess runs the handoff loop of benchHandoff on ZooKeeper
// contenders of this process.
func benchZKInProcess(b *testing.B, im zkImpl, n int) {
	key := zkBenchKey(im.name, n)
	warm, count := warmCount(*zkWarmup, n), zkTimedCount(b, n)
	// Bound the run: a stuck queue fails the benchmark instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(n)*50*time.Millisecond+time.Duration(warm+count)*time.Second)
	defer cancel()

	admin, err := zkConnect(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	defer checkZKKey(b, admin, key) // after the contenders closed

	cons := make([]contender, 0, n)
	defer func() {
		// Close the contenders, ending their sessions, in parallel: with
		// 100 contenders this is otherwise slow.
		var wg sync.WaitGroup
		for i, c := range cons {
			wg.Go(func() {
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer ccancel()
				if err := c.close(cctx); err != nil {
					b.Errorf("close contender %d: %v", i, err)
				}
			})
		}
		wg.Wait()
	}()
	var mem memCost
	mem.mark(n)
	wire := newWireLog()
	made := make([]contender, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			made[i], errs[i] = im.new(ctx, key, i, wire.dialer(i))
		})
	}
	wg.Wait()
	for _, c := range made {
		if c != nil {
			cons = append(cons, c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}

	reqs := zkRequests{n: int64(count)}
	var cpu cpuMeter
	handoffLoop{
		cons:       cons,
		warm:       warm,
		count:      count,
		queued:     func() (int, error) { c, _, err := admin.Children(key); return len(c), err },
		dump:       func(state []atomic.Int32) string { return dumpZKQueue(admin, key, state) },
		queuedHook: mem.measure,
		begin:      func(b *testing.B) { reqs.begin(b); cpu.begin() },
		end: func(b *testing.B) {
			cpu.report(b, count, true)
			reqs.report(b)
			wire.report(b, n)
		},
		trace: wire.handoff,
	}.run(b, ctx, cancel)
}

// dumpZKQueue describes the nodes under key and what each contender is
// doing, for a stalled run.
func dumpZKQueue(admin *zk.Conn, key string, state []atomic.Int32) string {
	var out []byte
	children, _, err := admin.Children(key)
	if err != nil {
		return fmt.Sprintf("reading the queue: %v", err)
	}
	slices.SortFunc(children, func(a, b string) int { return strings.Compare(a[max(len(a)-10, 0):], b[max(len(b)-10, 0):]) })
	out = fmt.Appendf(out, "queue under %s (lowest sequence first):\n", key)
	for _, c := range children {
		data, stat, err := admin.Get(key + "/" + c)
		if err != nil {
			out = fmt.Appendf(out, "  %s: %v\n", c, err)
			continue
		}
		out = fmt.Appendf(out, "  %s czxid=%d owner=%#x data=%q\n", c, stat.Czxid, stat.EphemeralOwner, data)
	}
	names := [...]string{stCampaigning: "campaigning", stHolding: "holding", stResigning: "resigning"}
	for i := range state {
		out = fmt.Appendf(out, "  contender %d: %s\n", i, names[state[i].Load()])
	}
	return string(out)
}

// driverRun is what a driver reported, read from its stdout.
type driverRun struct {
	queued, started, finished chan struct{}
	done                      chan struct{} // stdout reached EOF

	// Set before done is closed.
	lats    []time.Duration
	elapsed time.Duration
	errs    []string
	ok      bool
	bad     []string // lines not in the protocol
}

// read parses the driver's lines (see testdata/zkbench/CuratorHandoff.java)
// into r, counting progress into st; at EOF before the "finished" line it
// cancels the run (the driver has exited: nothing more will happen).
func (r *driverRun) read(stdout io.Reader, st *handoffState, warm int, cancel context.CancelFunc) {
	defer close(r.done)
	defer func() {
		select {
		case <-r.finished:
		default:
			cancel()
		}
	}()
	var once [3]sync.Once
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		word, rest, _ := strings.Cut(line, " ")
		switch word {
		case "queued":
			once[0].Do(func() { close(r.queued) })
		case "start":
			once[1].Do(func() { close(r.started) })
		case "finished":
			once[2].Do(func() { close(r.finished) })
		case "progress":
			if k, err := strconv.Atoi(rest); err == nil {
				st.mu.Lock()
				st.handoffs = k - warm // stays negative during the warm-up
				st.mu.Unlock()
			} else {
				r.bad = append(r.bad, line)
			}
		case "lat":
			if ns, err := strconv.ParseInt(rest, 10, 64); err == nil {
				r.lats = append(r.lats, time.Duration(ns))
			} else {
				r.bad = append(r.bad, line)
			}
		case "elapsed":
			if ns, err := strconv.ParseInt(rest, 10, 64); err == nil {
				r.elapsed = time.Duration(ns)
			} else {
				r.bad = append(r.bad, line)
			}
		case "error":
			r.errs = append(r.errs, rest)
		case "ok":
			r.ok = true
		default:
			r.bad = append(r.bad, line)
		}
	}
	if err := sc.Err(); err != nil {
		r.errs = append(r.errs, "reading stdout: "+err.Error())
	}
}

// benchZKDriver runs a driver program for im, which runs the handoff loop
// with n contender threads of its own and reports the latencies it
// measured.
func benchZKDriver(b *testing.B, im zkImpl, n int) {
	key := zkBenchKey(im.name, n)
	warm, count := warmCount(*zkWarmup, n), zkTimedCount(b, n)
	if n > maxDriverContenders {
		b.Skipf("not feasible: %s with %d clients in one driver process (each client brings its own I/O and event threads); measured up to %d", im.name, n, maxDriverContenders)
	}
	argv, err := im.command(key, n, warm, count)
	if err != nil {
		b.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second+time.Duration(n)*100*time.Millisecond+time.Duration(warm+count)*time.Second)
	defer cancel()

	admin, err := zkConnect(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	defer checkZKKey(b, admin, key) // after the driver closed its clients

	cmd := exec.Command(argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe() // closing it aborts the driver
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := &driverRun{queued: make(chan struct{}), started: make(chan struct{}), finished: make(chan struct{}), done: make(chan struct{})}
	st := &handoffState{handoffs: -warm}
	go r.read(stdout, st, warm, cancel)

	exited := false
	wait := func() error {
		// Ask the driver to stop (it closes its clients, ending their
		// sessions), and kill it if it does not within 20 s.
		stdin.Close()
		select {
		case <-r.done:
		case <-time.After(20*time.Second + time.Duration(n)*50*time.Millisecond):
			b.Errorf("%s driver still running %v after stdin closed: killing it", im.name, 20*time.Second+time.Duration(n)*50*time.Millisecond)
			cmd.Process.Kill()
			<-r.done
		}
		exited = true
		return cmd.Wait()
	}
	defer func() {
		if !exited {
			wait()
		}
	}()
	fail := func(format string, args ...any) {
		b.StopTimer()
		err := wait()
		b.Fatalf("%s (driver: %v; errors: %q; stderr:\n%s)", fmt.Sprintf(format, args...), err, r.errs, stderr.Bytes())
	}

	// The driver starts once all n nodes are queued under the key.
	select {
	case <-r.queued:
	case <-ctx.Done():
		fail("contenders not all queued: %v", ctx.Err())
	}
	if !awaitFinished(ctx, st, r.started) {
		fail("warm-up stopped after %d of %d handoffs (stall limit %v, ctx: %v)", st.count()+warm, warm, stallTimeout, ctx.Err())
	}
	rss := rssKB(cmd.Process.Pid) / float64(n)
	reqs := zkRequests{n: int64(count)}
	var cpu cpuMeter
	reqs.begin(b)
	cpu.begin()
	// The first timed release waits for this line: the counters above
	// cover every timed handoff.
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		fail("write go: %v", err)
	}
	b.ResetTimer()
	if !awaitFinished(ctx, st, r.finished) {
		fail("run stopped after %d of %d handoffs (stall limit %v, ctx: %v)", st.count(), count, stallTimeout, ctx.Err())
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(count), "ns/op") // per timed handoff, as handoffLoop's
	cpu.report(b, count, false)
	reqs.report(b)

	// The driver now stops its waiters, closes its clients (their
	// requests come after the counters were read) and prints the
	// latencies.
	if _, err := io.WriteString(stdin, "stop\n"); err != nil {
		fail("write stop: %v", err)
	}
	select {
	case <-r.done:
	case <-time.After(60*time.Second + time.Duration(n)*100*time.Millisecond):
		fail("no clean end %v after the last handoff", 60*time.Second+time.Duration(n)*100*time.Millisecond)
	}
	if err := wait(); err != nil || !r.ok || len(r.errs) > 0 || len(r.bad) > 0 {
		b.Fatalf("%s driver: exit %v, ok line %v, errors %q, unexpected lines %q; stderr:\n%s", im.name, err, r.ok, r.errs, r.bad, stderr.Bytes())
	}
	if len(r.lats) != count {
		b.Fatalf("%s driver reported %d handoffs, want %d", im.name, len(r.lats), count)
	}
	reportLatencies(b, r.lats, r.elapsed)
	b.ReportMetric(rss, "rss-KB/candidate")
}
