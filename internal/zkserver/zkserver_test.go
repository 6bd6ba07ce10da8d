package zkserver

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

// go-zookeeper's goroutines all end before its event channel closes, which
// Conn.Close does not wait for; closeConn does, so no goleak option is
// needed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// zkLog collects go-zookeeper's log lines, to keep them out of the test
// output unless a test fails and to read the negotiated session timeout.
type zkLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *zkLog) Printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *zkLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

var authenticated = regexp.MustCompile(`authenticated: id=-?\d+, timeout=(\d+)`)

// sessionTimeout is the timeout of the last session the server granted.
// go-zookeeper logs it just after it reports StateHasSession, so wait for it.
func (l *zkLog) sessionTimeout() time.Duration {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if m := authenticated.FindAllStringSubmatch(l.String(), -1); m != nil {
			n, _ := strconv.Atoi(m[len(m)-1][1])
			return time.Duration(n) * time.Millisecond
		}
	}
	return 0
}

// connect opens a go-zookeeper session, waits until it has one and closes
// it, waiting for its goroutines, at the end of the test.
func connect(t *testing.T, servers []string, timeout time.Duration) (*zk.Conn, *zkLog) {
	t.Helper()
	log := &zkLog{}
	conn, events, err := zk.Connect(servers, timeout, zk.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		for range events { // closed once the connection's goroutines are done
		}
		if t.Failed() {
			t.Logf("go-zookeeper log:\n%s", log)
		}
	})
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.State == zk.StateHasSession {
				return conn, log
			}
		case <-deadline:
			t.Fatalf("no session with %v after 10s; go-zookeeper log:\n%s", servers, log)
		}
	}
}

func startEnsemble(t *testing.T, opts Options) *Ensemble {
	t.Helper()
	if err := Installed(); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	e, err := Start(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	t.Logf("%d server(s) serving after %v: %v", e.Len(), time.Since(began).Round(time.Millisecond), e.Endpoints())
	return e
}

func TestStandalone(t *testing.T) {
	t.Parallel()
	e := startEnsemble(t, Options{})
	if l, err := e.Leader(); err != nil || l != 0 {
		t.Fatalf("Leader() = %d, %v; want 0", l, err)
	}
	if got := e.Endpoint(0); !strings.HasPrefix(got, "127.0.0.1:") || got != e.Endpoints()[0] {
		t.Fatalf("Endpoint(0) = %q, Endpoints() = %q", got, e.Endpoints())
	}

	conn, _ := connect(t, e.Endpoints(), 2*time.Second)
	if _, err := conn.Create("/a", []byte("hello"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if data, _, err := conn.Get("/a"); err != nil || string(data) != "hello" {
		t.Fatalf("Get(/a) = %q, %v", data, err)
	}

	// The server clamps the requested session timeout to
	// [MinSessionTimeout, MaxSessionTimeout] = [2, 20] ticks = [200ms, 2s].
	for _, c := range []struct{ ask, want time.Duration }{
		{50 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, time.Second},
		{time.Hour, 2 * time.Second},
	} {
		_, log := connect(t, e.Endpoints(), c.ask)
		if got := log.sessionTimeout(); got != c.want {
			t.Errorf("asked for a %v session, got %v; want %v", c.ask, got, c.want)
		}
	}

	// Kill and Restart keep the data.
	if err := e.Kill(0); err != nil {
		t.Fatal(err)
	}
	if err := e.Kill(0); err == nil {
		t.Error("Kill of a stopped server succeeded")
	}
	if err := e.Restart(0); err != nil {
		t.Fatal(err)
	}
	conn2, _ := connect(t, e.Endpoints(), 2*time.Second)
	if data, _, err := conn2.Get("/a"); err != nil || string(data) != "hello" {
		t.Fatalf("after restart, Get(/a) = %q, %v", data, err)
	}

	e.Close()
	e.Close() // idempotent
	if _, err := os.Stat(e.LogFile(0)); err != nil {
		t.Errorf("Close removed the log: %v", err)
	}
	if err := e.Restart(0); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

func TestEnsemble(t *testing.T) {
	t.Parallel()
	e := startEnsemble(t, Options{Servers: 3})
	old, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		mode, err := srvrMode(e.Endpoint(i), time.Second)
		if want := map[bool]string{true: "leader", false: "follower"}[i == old]; err != nil || mode != want {
			t.Errorf("server %d: mode %q, %v; want %s", i, mode, err, want)
		}
	}

	conn, _ := connect(t, e.Endpoints(), 2*time.Second)
	if _, err := conn.Create("/x", []byte("before"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if data, _, err := conn.Get("/x"); err != nil || string(data) != "before" {
		t.Fatalf("Get(/x) = %q, %v", data, err)
	}

	killed := time.Now()
	if err := e.Kill(old); err != nil {
		t.Fatal(err)
	}
	var leader int
	for {
		if leader, err = e.Leader(); err == nil {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no new leader 30s after killing server %d: %v", old, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if leader == old {
		t.Fatalf("killed server %d still leads", old)
	}
	t.Logf("killed leader %d; server %d leads after %v", old, leader, time.Since(killed).Round(time.Millisecond))

	// The client reconnects (its server may have been the dead leader, and
	// followers drop their clients while they elect) and writes.
	for {
		_, err := conn.Set("/x", []byte("after"), -1)
		if err == nil {
			break
		}
		if !errors.Is(err, zk.ErrConnectionClosed) && !errors.Is(err, zk.ErrClosing) {
			t.Fatalf("Set(/x) after failover: %v", err)
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("Set(/x) still failing 30s after failover: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("client wrote %v after the kill", time.Since(killed).Round(time.Millisecond))

	// The old leader comes back as a follower with the new data.
	if err := e.Restart(old); err != nil {
		t.Fatal(err)
	}
	if mode, err := srvrMode(e.Endpoint(old), time.Second); err != nil || mode != "follower" {
		t.Fatalf("restarted server %d: mode %q, %v; want follower", old, mode, err)
	}
	conn2, _ := connect(t, []string{e.Endpoint(old)}, 2*time.Second)
	if _, err := conn2.Sync("/x"); err != nil {
		t.Fatal(err)
	}
	if data, _, err := conn2.Get("/x"); err != nil || string(data) != "after" {
		t.Fatalf("Get(/x) on restarted server %d = %q, %v", old, data, err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := Options{Servers: 1, TickTime: 100 * time.Millisecond, MinSessionTimeout: 200 * time.Millisecond,
		MaxSessionTimeout: 2 * time.Second, StartTimeout: 60 * time.Second}
	if o != want {
		t.Fatalf("defaults = %+v, want %+v", o, want)
	}
	if _, err := (Options{MinSessionTimeout: time.Second, MaxSessionTimeout: time.Millisecond}).withDefaults(); err == nil {
		t.Error("inverted session timeouts accepted")
	}
}

// TestPartitionable: Sessions names the sessions connected to a server;
// Isolate cuts a follower off from the others (it stops serving its
// clients, while the other two keep a quorum and take writes) and Rejoin
// brings it back with what it missed; a killed leader is replaced as fast
// as without proxies. Isolate needs Partitionable.
func TestPartitionable(t *testing.T) {
	t.Parallel()
	e := startEnsemble(t, Options{Servers: 3, Partitionable: true})
	leader, err := e.Leader()
	if err != nil {
		t.Fatal(err)
	}
	f, other := (leader+1)%3, (leader+2)%3
	conn, _ := connect(t, []string{e.Endpoint(f)}, 2*time.Second)
	ids, err := e.Sessions(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, conn.SessionID()) {
		t.Fatalf("Sessions(%d) = %#x, want it to hold the session %#x connected to it", f, ids, conn.SessionID())
	}
	if ids, err := e.Sessions(other); err != nil || slices.Contains(ids, conn.SessionID()) {
		t.Fatalf("Sessions(%d) = %#x, %v; the session %#x is connected to server %d", other, ids, err, conn.SessionID(), f)
	}

	cut := time.Now()
	if err := e.Isolate(f); err != nil {
		t.Fatal(err)
	}
	for e.Mode(f) != "" {
		if time.Since(cut) > 10*time.Second {
			t.Fatalf("isolated server %d still serves (mode %q) 10s after the cut", f, e.Mode(f))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("isolated follower %d stopped serving %v after the cut", f, time.Since(cut).Round(time.Millisecond))
	if m := e.Mode(leader); m != "leader" {
		t.Fatalf("server %d: mode %q after the follower was cut off, want leader", leader, m)
	}
	majority, _ := connect(t, []string{e.Endpoint(other)}, 2*time.Second)
	if _, err := majority.Create("/during", nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("write on the majority's side: %v", err)
	}

	if err := e.Rejoin(f); err != nil {
		t.Fatal(err)
	}
	for e.Mode(f) != "follower" {
		if time.Since(cut) > 40*time.Second {
			t.Fatalf("server %d not following 40s after the cut and rejoin (mode %q)", f, e.Mode(f))
		}
		time.Sleep(10 * time.Millisecond)
	}
	back, _ := connect(t, []string{e.Endpoint(f)}, 2*time.Second)
	if ok, _, err := back.Exists("/during"); err != nil || !ok {
		t.Fatalf("rejoined server %d: Exists(/during) = %v, %v; want the write it missed", f, ok, err)
	}

	// Killing the leader: the proxies must look like a stopped server
	// (refused connections) and like a leader that opens its quorum port a
	// moment after its election (a follower's connection waits for it).
	// Proxies that accepted and then closed made every election after a
	// kill take 2.5–7 s (the new leader waited initLimit × tickTime for
	// followers that had given up), against 0.4 s without proxies.
	for round := range 2 {
		old, err := e.Leader()
		if err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		if err := e.Kill(old); err != nil {
			t.Fatal(err)
		}
		for {
			leader, err := e.Leader()
			if err == nil && leader != old && slices.ContainsFunc([]int{0, 1, 2}, func(i int) bool { return i != old && i != leader && e.Mode(i) == "follower" }) {
				break
			}
			if time.Since(killed) > 30*time.Second {
				t.Fatalf("round %d: no leader with a follower 30s after killing leader %d", round, old)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(killed)
		t.Logf("round %d: killed leader %d; a new leader and its follower serve %v later", round, old, took.Round(time.Millisecond))
		// initLimit × tickTime: what a new leader waits for its followers.
		if took > 2*time.Second {
			t.Errorf("round %d: the election after the kill took %v, at least initLimit × tickTime (2s): a follower gave up on the new leader", round, took)
		}
		if err := e.Restart(old); err != nil {
			t.Fatal(err)
		}
	}

	plain := startEnsemble(t, Options{Servers: 3})
	if err := plain.Isolate(0); err == nil {
		t.Fatal("Isolate on an ensemble started without Partitionable succeeded")
	}
}
