package test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	failoverTTL    = flag.Duration("bench.ttl", 2*time.Second, "TTL (session timeout) of the failover and pause benchmarks' holders")
	failoverRounds = flag.Int("bench.rounds", 2, "crash failovers per implementation in BenchmarkFailover (at most -benchtime's count)")
	pauseWindow    = flag.Duration("bench.window", 2*time.Second, "how long BenchmarkPauseOverlap watches a resumed holder's command")
)

// tickerEnv makes the test binary the command a holder runs: it prints
// "tick ID PID" every millisecond until it is killed.
const tickerEnv = "TENURE_BENCH_TICKER"

func tickerMain(id string) int {
	line := []byte(fmt.Sprintf("tick %s %d\n", id, os.Getpid()))
	for {
		if _, err := os.Stdout.Write(line); err != nil {
			return 1
		}
		time.Sleep(time.Millisecond)
	}
}

// lockProc is one holder process of a failover benchmark: `tenure exec`,
// `etcdctl lock` or kazoo's driver, running the ticker as its command. It
// runs in its own process group (so that a signal reaches the lock program
// and, for etcdctl and kazoo, its command).
type lockProc struct {
	id  string
	cmd *exec.Cmd

	mu       sync.Mutex
	first    time.Time // first tick
	last     time.Time // latest tick
	childPid int       // the ticker's pid
	started  chan struct{}
	done     chan struct{} // stdout closed and the process waited for
	stderr   bytes.Buffer
}

// peer is a lock program that runs a command while it holds a key.
type peer struct {
	name string
	// argv returns the lock program's argv for key with ttl, running cmd.
	argv func(key string, ttl time.Duration, cmd []string) ([]string, error)
	// key returns the key (lock path) of round r.
	key func(r int) string
	// queued reports the contenders queued under key; nil when the
	// backend keeps no queue (Redis: the benchmark waits a second).
	queued func(ctx context.Context, key string) (int, error)
}

func tenureExecPeer(name, backend string, eps func() string, key func(int) string, queued func(context.Context, string) (int, error)) peer {
	return peer{name: name, key: key, queued: queued,
		argv: func(key string, ttl time.Duration, cmd []string) ([]string, error) {
			bin, err := tenureBinary()
			if err != nil {
				return nil, err
			}
			return append([]string{bin, "exec", "--backend", backend, "--endpoints", eps(), "--key", key, "--ttl", ttl.String()}, append([]string{"--"}, cmd...)...), nil
		}}
}

func etcdQueued(ctx context.Context, key string) (int, error) {
	cli, err := newClient()
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	r, err := cli.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(r.Count), nil
}

func zkQueued(ctx context.Context, key string) (int, error) {
	conn, err := zkConnect(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	c, _, err := conn.Children(key)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(c), err
}

func failoverPeers() []peer {
	etcdKey := func(r int) string { return fmt.Sprintf("/tenure-bench/failover/%d", keySeq.Add(1)) }
	zkKey := func(r int) string { return fmt.Sprintf("/tenure-bench/failover-%d", keySeq.Add(1)) }
	redisKey := func(r int) string { return fmt.Sprintf("tenure-bench:failover:%d", keySeq.Add(1)) }
	return []peer{
		tenureExecPeer("tenure-etcd", "etcd", func() string { return endpoint }, etcdKey, etcdQueued),
		tenureExecPeer("tenure-zk", "zk", func() string { return strings.Join(zkEndpoints, ",") }, zkKey, zkQueued),
		tenureExecPeer("tenure-redis", "redis", func() string { return redisEndpoint }, redisKey, nil),
		{name: "etcdctl-lock", key: etcdKey, queued: etcdQueued,
			argv: func(key string, ttl time.Duration, cmd []string) ([]string, error) {
				bin, err := etcdctlBinary()
				if err != nil {
					return nil, err
				}
				secs := max(int(ttl/time.Second), 1)
				return append([]string{bin, "--endpoints", endpoint, "lock", "--ttl", strconv.Itoa(secs), key}, cmd...), nil
			}},
		{name: "kazoo", key: zkKey, queued: zkQueued,
			argv: func(key string, ttl time.Duration, cmd []string) ([]string, error) {
				// kazooCommand finds a python3 that imports kazoo.
				if _, err := kazooCommand("/x", 1, 0, 1); err != nil {
					return nil, err
				}
				return append([]string{kazooPython, filepath.Join("testdata", "failover", "kazoo_lock.py"),
					strings.Join(zkEndpoints, ","), key, strconv.FormatInt(ttl.Milliseconds(), 10)}, cmd...), nil
			}},
	}
}

// startLockProc starts p's lock program for key, running the ticker with
// id as its command.
func startLockProc(p peer, key, id string, ttl time.Duration) (*lockProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	argv, err := p.argv(key, ttl, []string{self})
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), tickerEnv+"="+id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	lp := &lockProc{id: id, cmd: cmd, started: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &lp.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(lp.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 3 || f[0] != "tick" {
				continue
			}
			now := time.Now()
			lp.mu.Lock()
			if lp.first.IsZero() {
				lp.first = now
				lp.childPid, _ = strconv.Atoi(f[2])
				close(lp.started)
			}
			lp.last = now
			lp.mu.Unlock()
		}
		io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
	}()
	return lp, nil
}

func (lp *lockProc) ticks() (first, last time.Time, child int) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.first, lp.last, lp.childPid
}

// signal sends s to the lock program's process group and, when the command
// runs in a group of its own (tenure exec), to that group too. SIGCONT
// reaches the command first: a paused machine resumes both at once, and
// a supervisor resumed first could stop its command before the command
// ran again, which would hide the overlap the benchmark measures.
func (lp *lockProc) signal(s syscall.Signal) {
	_, _, child := lp.ticks()
	// Every process under the lock process too, each in its own right:
	// tenure exec's guard runs in a session of its own, and a paused VM
	// pauses it with the rest.
	tree := descendants(lp.cmd.Process.Pid)
	toChild := func() {
		if child != 0 {
			_ = syscall.Kill(-child, s)
			_ = syscall.Kill(child, s)
		}
		for _, pid := range tree {
			_ = syscall.Kill(pid, s)
		}
	}
	if s == syscall.SIGCONT {
		toChild()
	}
	_ = syscall.Kill(-lp.cmd.Process.Pid, s)
	if s != syscall.SIGCONT {
		toChild()
	}
}

// descendants returns the processes that descend from pid, read from the
// children files of /proc (empty where the kernel has none).
func descendants(pid int) []int {
	var out []int
	next := []int{pid}
	for len(next) > 0 {
		p := next[0]
		next = next[1:]
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(p) + "/task/*/children")
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			for _, field := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(field); err == nil {
					out = append(out, c)
					next = append(next, c)
				}
			}
		}
	}
	return out
}

// stop ends the process: SIGTERM (a clean release), SIGKILL after 5 s.
func (lp *lockProc) stop() {
	lp.signal(syscall.SIGCONT)
	lp.signal(syscall.SIGTERM)
	select {
	case <-lp.done:
	case <-time.After(5 * time.Second):
		lp.signal(syscall.SIGKILL)
		<-lp.done
	}
}

// awaitStart waits for the first tick of lp's command.
func (lp *lockProc) awaitStart(ctx context.Context) error {
	select {
	case <-lp.started:
		return nil
	case <-lp.done:
		return fmt.Errorf("%s exited before its command ran: %s", lp.id, lp.stderr.String())
	case <-ctx.Done():
		return fmt.Errorf("%s: command not started: %w; stderr: %s", lp.id, ctx.Err(), lp.stderr.String())
	}
}

// standby starts the holder and a second candidate for a fresh key, and
// returns once the holder's command runs and the standby waits.
func standby(ctx context.Context, p peer, round int, ttl time.Duration) (a, b *lockProc, err error) {
	key := p.key(round)
	a, err = startLockProc(p, key, fmt.Sprintf("A%d", round), ttl)
	if err != nil {
		return nil, nil, err
	}
	if err := a.awaitStart(ctx); err != nil {
		a.stop()
		return nil, nil, err
	}
	b, err = startLockProc(p, key, fmt.Sprintf("B%d", round), ttl)
	if err != nil {
		a.stop()
		return nil, nil, err
	}
	if p.queued == nil {
		time.Sleep(time.Second) // no queue to see: give it time to wait
		return a, b, nil
	}
	for {
		q, err := p.queued(ctx, key)
		if err == nil && q >= 2 {
			time.Sleep(100 * time.Millisecond) // its watch too
			return a, b, nil
		}
		select {
		case <-b.done:
			a.stop()
			return nil, nil, fmt.Errorf("standby exited: %s", b.stderr.String())
		case <-ctx.Done():
			a.stop()
			b.stop()
			return nil, nil, fmt.Errorf("standby not queued: %w (last %d, %v)", ctx.Err(), q, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// BenchmarkFailover measures crash failover with real processes: a holder
// (`tenure exec` on each backend, `etcdctl lock`, a kazoo Lock driver)
// runs a command; a second one waits; the holder's process group gets
// SIGKILL (as a crashed machine), and the time until the standby's command
// prints its first line is one failover. Every implementation uses the
// same TTL (-bench.ttl; etcd leases take whole seconds, ZooKeeper's is the
// session timeout). Metrics: failover-ms (median), failover-max-ms,
// ttl-ms. The rounds are min(b.N, -bench.rounds).
func BenchmarkFailover(b *testing.B) {
	for _, p := range failoverPeers() {
		b.Run("impl="+p.name, func(b *testing.B) {
			if probeRun(b) {
				return
			}
			ttl := *failoverTTL
			rounds := max(min(b.N, *failoverRounds), 1)
			var fos []time.Duration
			for r := range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+3*ttl)
				a, s, err := standby(ctx, p, r, ttl)
				if err != nil {
					cancel()
					if strings.Contains(err.Error(), "kazoo:") {
						b.Skip(err)
					}
					b.Fatal(err)
				}
				t0 := time.Now()
				a.signal(syscall.SIGKILL)
				err = s.awaitStart(ctx)
				first, _, _ := s.ticks()
				<-a.done
				s.stop()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				if !first.After(t0) {
					b.Fatalf("round %d: the standby's command ran %v before the holder was killed: it was not waiting", r, t0.Sub(first))
				}
				fos = append(fos, first.Sub(t0))
			}
			slices.Sort(fos)
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			median := fos[len(fos)/2]
			if len(fos)%2 == 0 {
				median = (fos[len(fos)/2-1] + fos[len(fos)/2]) / 2
			}
			b.ReportMetric(ms(median), "failover-ms")
			b.ReportMetric(ms(fos[len(fos)-1]), "failover-max-ms")
			b.ReportMetric(ms(ttl), "ttl-ms")
			b.ReportMetric(float64(len(fos)), "rounds")
		})
	}
}

// BenchmarkPauseOverlap freezes a holder and its command (SIGSTOP to both
// process groups, as a paused VM) until the standby's command has run for
// a while, past the TTL, then resumes them (SIGCONT), and measures how long
// the old command keeps running after the resume: its last line minus the
// resume time. A command that still prints -bench.window later was never
// stopped (`etcdctl lock` runs its command to the end whatever happens to
// the lock): overlap-ms is then the window, and stopped 0.
func BenchmarkPauseOverlap(b *testing.B) {
	for _, p := range failoverPeers() {
		if p.name == "kazoo" {
			continue
		}
		b.Run("impl="+p.name, func(b *testing.B) {
			if probeRun(b) {
				return
			}
			ttl := *failoverTTL
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+3*ttl)
			defer cancel()
			a, s, err := standby(ctx, p, 0, ttl)
			if err != nil {
				b.Fatal(err) // a peer that cannot be built must not drop out of the report unseen
			}
			defer a.stop()
			defer s.stop()
			a.signal(syscall.SIGSTOP)
			tStop := time.Now()
			if err := s.awaitStart(ctx); err != nil {
				a.signal(syscall.SIGKILL)
				b.Fatal(err)
			}
			newStart, _, _ := s.ticks()
			time.Sleep(200 * time.Millisecond)
			tResume := time.Now()
			a.signal(syscall.SIGCONT)
			window := *pauseWindow
			time.Sleep(window)
			_, last, _ := a.ticks()
			stillRunning := time.Since(last) < 100*time.Millisecond
			overlap := max(last.Sub(tResume), 0)
			stopped := 1.0
			if stillRunning {
				overlap, stopped = window, 0
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(overlap), "overlap-ms")
			b.ReportMetric(stopped, "stopped")
			b.ReportMetric(ms(newStart.Sub(tStop)), "takeover-ms")
			b.ReportMetric(ms(ttl), "ttl-ms")
			b.ReportMetric(ms(window), "window-ms")
		})
	}
}
