package zkelect_test

// Interoperability with the ZooKeeper lock recipes tenure's zkelect shares a
// lock path with: Apache Curator's InterProcessMutex (Java) and kazoo's Lock
// (Python, with extra_lock_patterns=("-lock-",)), both run for real as child
// processes: testdata/interop/CuratorLock.java, compiled here with javac
// against Debian's Curator jars, and testdata/interop/kazoo_lock.py, run by
// Debian's python3 with python3-kazoo. scripts/test.sh installs all of them.
//
// Each peer process speaks a line protocol on stdout: "QUEUED <name>
// <node>" once its lock node exists, "ACQUIRED <name> <unix nanos>",
// "RELEASING <name> <unix nanos>" (it stops using the lock),
// "RELEASED <name> <unix nanos>"; it holds the lock until the test writes
// "release" to its stdin (or closes it), then exits 0.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

const (
	// interopStart bounds a peer's start: a JVM or a Python interpreter,
	// its connection, and its lock node.
	interopStart = 20 * time.Second
	// interopStep bounds every other wait.
	interopStep = 10 * time.Second
	// interopHold is how long a holder keeps the lock while the test checks
	// that the next in line does not take it.
	interopHold = 750 * time.Millisecond
)

// curatorJars are the jars, in zkserver.JavaDir, that CuratorLock needs next
// to ZooKeeper's (zkserver.Classpath: the client, jute, slf4j to log4j 1.2,
// netty, jackson-databind, which curator-framework also uses): Curator's
// three and Guava (Debian's Curator does not shade it; Debian's guava.jar
// also holds failureaccess's class).
var curatorJars = []string{"curator-client.jar", "curator-framework.jar", "curator-recipes.jar", "guava.jar"}

// interopPeer is one foreign lock implementation.
type interopPeer struct {
	kind string
	// node is the shape of its lock nodes' names.
	node *regexp.Regexp
	// command runs one contender named name on key, holding until told.
	command func(connect, key, name string) *exec.Cmd
}

// curatorPeer compiles CuratorLock.java into a temporary directory.
func curatorPeer(t *testing.T) interopPeer {
	t.Helper()
	javac, err := exec.LookPath("javac")
	if err != nil {
		t.Fatalf("the Curator interop test needs javac (a JDK): run `make test`, which installs it: %v", err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("the Curator interop test needs java: %v", err)
	}
	cp := zkserver.Classpath()
	for _, j := range curatorJars {
		cp = append(cp, filepath.Join(zkserver.JavaDir, j))
	}
	for _, j := range cp {
		if _, err := os.Stat(j); err != nil {
			t.Fatalf("the Curator interop test needs %s (Debian's libcurator-recipes-java): run `make test`, which installs it", j)
		}
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := filepath.Join("testdata", "interop", "CuratorLock.java")
	start := time.Now()
	out, err := exec.CommandContext(ctx, javac, "-d", dir, "-cp", strings.Join(cp, ":"), src).CombinedOutput()
	if err != nil {
		t.Fatalf("javac %s: %v\n%s", src, err, out)
	}
	t.Logf("compiled %s in %v", src, time.Since(start).Round(time.Millisecond))
	classpath := strings.Join(append([]string{dir}, cp...), ":")
	return interopPeer{
		kind: "curator",
		node: regexp.MustCompile(`^_c_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-lock-[0-9]{10}$`),
		command: func(connect, key, name string) *exec.Cmd {
			return exec.Command(java, "-Xmx64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
				"-cp", classpath, "CuratorLock", connect, key, name, "0")
		},
	}
}

// kazooPeer finds a python3 with kazoo: Debian's, where python3-kazoo
// installs it, before whatever python3 is first on PATH.
func kazooPeer(t *testing.T) interopPeer {
	t.Helper()
	var candidates []string
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		candidates = append(candidates, "/usr/bin/python3")
	}
	if p, err := exec.LookPath("python3"); err == nil {
		candidates = append(candidates, p)
	}
	python := ""
	for _, p := range candidates {
		if exec.Command(p, "-c", "import kazoo.recipe.lock").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Fatalf("the kazoo interop test needs a python3 with kazoo (Debian's python3-kazoo; tried %v): run `make test`, which installs it", candidates)
	}
	script, err := filepath.Abs(filepath.Join("testdata", "interop", "kazoo_lock.py"))
	if err != nil {
		t.Fatal(err)
	}
	return interopPeer{
		kind: "kazoo",
		node: regexp.MustCompile(`^[0-9a-f]{32}__lock__[0-9]{10}$`),
		command: func(connect, key, name string) *exec.Cmd {
			return exec.Command(python, "-W", "ignore::DeprecationWarning", script, connect, key, name, "0")
		},
	}
}

func TestInterop_Curator(t *testing.T) {
	peer := curatorPeer(t)
	t.Run("PeerBetweenTenures", func(t *testing.T) { testPeerBetweenTenures(t, peer) })
	t.Run("TenureBetweenPeers", func(t *testing.T) { testTenureBetweenPeers(t, peer) })
}

func TestInterop_Kazoo(t *testing.T) {
	peer := kazooPeer(t)
	t.Run("PeerBetweenTenures", func(t *testing.T) { testPeerBetweenTenures(t, peer) })
	t.Run("TenureBetweenPeers", func(t *testing.T) { testTenureBetweenPeers(t, peer) })
}

// testPeerBetweenTenures: tenure A leads, the peer P queues, tenure B queues
// behind P. A resigns: P, not B, acquires, and B waits while P holds; P
// releases: B is elected.
func testPeerBetweenTenures(t *testing.T, peer interopPeer) {
	env := newInteropEnv(t)
	key := env.key()
	a := env.elector(key, "tenure-A")
	b := env.elector(key, "tenure-B")

	termA, err := a.Campaign(env.ctx)
	if err != nil {
		t.Fatalf("A: Campaign: %v", err)
	}
	nodeA, _ := env.nodeOf(key, "tenure-A")

	p := env.startPeer(peer, key, "peer-P")
	nodeP := p.expect(t, "QUEUED", interopStart).node
	if !peer.node.MatchString(nodeP) {
		t.Errorf("%s node %q does not have the shape %v", peer.kind, nodeP, peer.node)
	}
	env.waitContenders(key, 2)

	bDone := env.campaign(b)
	env.waitPosition(b, 2)
	nodeB, _ := env.nodeOf(key, "tenure-B")
	env.logQueue(key)
	env.checkArrival(key, nodeA, nodeP, nodeB)
	env.checkLeader(b, key, "tenure-A", termA.Token)
	// P must not acquire while A leads.
	p.quiet(t, interopHold/3)
	if !a.IsLeader() {
		t.Fatalf("A lost its term while P waited: %v", a.Err())
	}

	endA := time.Now()
	if err := a.Resign(env.ctx); err != nil {
		t.Fatalf("A: Resign: %v", err)
	}
	resignedA := time.Now()
	acqP := p.expect(t, "ACQUIRED", interopStep)
	czxidP := env.czxid(key, nodeP)
	if czxidP <= termA.Token {
		t.Errorf("P's czxid %d is not above A's token %d", czxidP, termA.Token)
	}
	env.checkLeader(b, key, "peer-P", czxidP)

	// B must not be elected while P holds.
	select {
	case r := <-bDone:
		t.Fatalf("B elected (%v, err %v) while %s P holds the lock", r.term, r.err, peer.kind)
	case <-time.After(interopHold):
	}
	if n, err := b.Position(env.ctx); err != nil || n != 1 {
		t.Errorf("B: Position = %d, %v while P holds; want 1", n, err)
	}

	p.release(t)
	relP := p.expect(t, "RELEASING", interopStep)
	releasedP := p.expect(t, "RELEASED", interopStep)
	var rB campaignResult
	select {
	case rB = <-bDone:
	case <-time.After(interopStep):
		t.Fatalf("B not elected within %v of P's release; queue %v", interopStep, env.queue(key))
	}
	if rB.err != nil {
		t.Fatalf("B: Campaign: %v", rB.err)
	}
	p.waitExit(t)
	if rB.term.Token <= czxidP {
		t.Errorf("B's token %d is not above P's czxid %d", rB.term.Token, czxidP)
	}
	endB := time.Now()
	if err := b.Resign(env.ctx); err != nil {
		t.Fatalf("B: Resign: %v", err)
	}

	t.Logf("A resign call took %v; P acquired %v after A's resign began",
		resignedA.Sub(endA).Round(time.Microsecond), time.Duration(acqP.at-endA.UnixNano()).Round(time.Microsecond))
	t.Logf("B elected %v after P's RELEASING, %v after P's RELEASED (negative: B was elected before P's release call returned)",
		time.Duration(rB.term.Since.UnixNano()-relP.at).Round(time.Microsecond),
		time.Duration(rB.term.Since.UnixNano()-releasedP.at).Round(time.Microsecond))
	checkExclusive(t,
		holding{"tenure-A", termA.Since.UnixNano(), endA.UnixNano()},
		holding{peer.kind + " P", acqP.at, relP.at},
		holding{"tenure-B", rB.term.Since.UnixNano(), endB.UnixNano()},
	)
}

// testTenureBetweenPeers: the peer P holds, tenure A queues, a second peer
// P2 queues behind A. P releases: A, not P2, is elected, and P2 waits while
// A leads; A resigns: P2 acquires.
func testTenureBetweenPeers(t *testing.T, peer interopPeer) {
	env := newInteropEnv(t)
	key := env.key()
	a := env.elector(key, "tenure-A")

	p := env.startPeer(peer, key, "peer-P")
	nodeP := p.expect(t, "QUEUED", interopStart).node
	acqP := p.expect(t, "ACQUIRED", interopStep)
	if !peer.node.MatchString(nodeP) {
		t.Errorf("%s node %q does not have the shape %v", peer.kind, nodeP, peer.node)
	}
	czxidP := env.czxid(key, nodeP)

	aDone := env.campaign(a)
	env.waitPosition(a, 1)
	nodeA, _ := env.nodeOf(key, "tenure-A")

	p2 := env.startPeer(peer, key, "peer-P2")
	nodeP2 := p2.expect(t, "QUEUED", interopStart).node
	env.waitContenders(key, 3)
	env.logQueue(key)
	env.checkArrival(key, nodeP, nodeA, nodeP2)
	if n, err := a.Position(env.ctx); err != nil || n != 1 {
		t.Errorf("A: Position = %d, %v behind P; want 1", n, err)
	}
	env.checkLeader(a, key, "peer-P", czxidP)
	select {
	case r := <-aDone:
		t.Fatalf("A elected (%v, err %v) while %s P holds the lock", r.term, r.err, peer.kind)
	default:
	}

	p.release(t)
	relP := p.expect(t, "RELEASING", interopStep)
	releasedP := p.expect(t, "RELEASED", interopStep)
	var rA campaignResult
	select {
	case rA = <-aDone:
	case <-time.After(interopStep):
		t.Fatalf("A not elected within %v of P's release; queue %v", interopStep, env.queue(key))
	}
	if rA.err != nil {
		t.Fatalf("A: Campaign: %v", rA.err)
	}
	p.waitExit(t)
	if rA.term.Token <= czxidP {
		t.Errorf("A's token %d is not above P's czxid %d", rA.term.Token, czxidP)
	}
	env.checkLeader(a, key, "tenure-A", rA.term.Token)

	// P2 must not acquire while A leads.
	p2.quiet(t, interopHold)
	if !a.IsLeader() {
		t.Fatalf("A lost its term while P2 waited: %v", a.Err())
	}

	endA := time.Now()
	if err := a.Resign(env.ctx); err != nil {
		t.Fatalf("A: Resign: %v", err)
	}
	acqP2 := p2.expect(t, "ACQUIRED", interopStep)
	czxidP2 := env.czxid(key, nodeP2)
	if czxidP2 <= rA.term.Token {
		t.Errorf("P2's czxid %d is not above A's token %d", czxidP2, rA.term.Token)
	}
	env.checkLeader(a, key, "peer-P2", czxidP2)
	p2.release(t)
	relP2 := p2.expect(t, "RELEASING", interopStep)
	p2.expect(t, "RELEASED", interopStep)
	p2.waitExit(t)

	t.Logf("A elected %v after P's RELEASING, %v after P's RELEASED (negative: A was elected before P's release call returned); P2 acquired %v after A's resign began",
		time.Duration(rA.term.Since.UnixNano()-relP.at).Round(time.Microsecond),
		time.Duration(rA.term.Since.UnixNano()-releasedP.at).Round(time.Microsecond),
		time.Duration(acqP2.at-endA.UnixNano()).Round(time.Microsecond))
	checkExclusive(t,
		holding{peer.kind + " P", acqP.at, relP.at},
		holding{"tenure-A", rA.term.Since.UnixNano(), endA.UnixNano()},
		holding{peer.kind + " P2", acqP2.at, relP2.at},
	)
	if l, err := a.Leader(env.ctx); err != nil || !l.Vacant {
		t.Errorf("Leader after everyone left = %+v, %v; want vacant", l, err)
	}
}

// holding is one holder's time with the lock, in unix nanoseconds: from
// when it learned it holds to when it began to give it up.
type holding struct {
	who      string
	from, to int64
}

// checkExclusive checks that the holdings follow each other in the order
// given without overlapping.
func checkExclusive(t *testing.T, hs ...holding) {
	t.Helper()
	base := hs[0].from
	var b strings.Builder
	for i, h := range hs {
		fmt.Fprintf(&b, "\n  %-12s %9.3f ms .. %9.3f ms", h.who, float64(h.from-base)/1e6, float64(h.to-base)/1e6)
		if h.to < h.from {
			t.Errorf("%s: holding ends (%d) before it starts (%d)", h.who, h.to, h.from)
		}
		if i > 0 && h.from <= hs[i-1].to {
			t.Errorf("%s acquired at %d, before %s let go at %d: mutual exclusion or arrival order broken",
				h.who, h.from, hs[i-1].who, hs[i-1].to)
		}
	}
	t.Logf("holdings:%s", b.String())
}

// interopEnv holds one test's context, admin connection, electors and
// backends, and closes them in order.
type interopEnv struct {
	t      *testing.T
	ctx    context.Context
	admin  *zk.Conn
	wg     sync.WaitGroup // campaign goroutines
	closeF []func()
}

func newInteropEnv(t *testing.T) *interopEnv {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	admin := dial(t, server.Endpoints())
	env := &interopEnv{t: t, ctx: ctx, admin: admin.Conn()}
	t.Cleanup(func() {
		cancel()
		done := make(chan struct{})
		go func() { env.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(interopStep):
			t.Errorf("campaign goroutines still running %v after the test", interopStep)
		}
		for i := len(env.closeF) - 1; i >= 0; i-- {
			env.closeF[i]()
		}
		admin.Close()
	})
	return env
}

var interopKeySeq struct {
	sync.Mutex
	n int
}

// key returns a fresh lock path for the test.
func (env *interopEnv) key() string {
	interopKeySeq.Lock()
	interopKeySeq.n++
	n := interopKeySeq.n
	interopKeySeq.Unlock()
	name := strings.NewReplacer("/", "-", " ", "_").Replace(env.t.Name())
	return fmt.Sprintf("/tenure-interop/%s-%d-%d", name, time.Now().UnixNano(), n)
}

// elector returns an Elector on its own connection (and so its own
// ZooKeeper session).
func (env *interopEnv) elector(key, identity string) *election.Elector {
	env.t.Helper()
	b := dial(env.t, server.Endpoints())
	e, err := election.New(b, election.Config{Key: key, Identity: identity, TTL: ttl})
	if err != nil {
		b.Close()
		env.t.Fatalf("election.New: %v", err)
	}
	env.closeF = append(env.closeF, func() {
		ctx, cancel := context.WithTimeout(context.Background(), interopStep)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			env.t.Errorf("%s: Close: %v", identity, err)
		}
		b.Close()
	})
	return e
}

type campaignResult struct {
	term tenure.Term
	err  error
}

// campaign runs e.Campaign in the background.
func (env *interopEnv) campaign(e *election.Elector) <-chan campaignResult {
	ch := make(chan campaignResult, 1)
	env.wg.Add(1)
	go func() {
		defer env.wg.Done()
		term, err := e.Campaign(env.ctx)
		ch <- campaignResult{term, err}
	}()
	return ch
}

// waitPosition waits until e's campaign has n candidates ahead.
func (env *interopEnv) waitPosition(e *election.Elector, n int) {
	env.t.Helper()
	var got int
	var err error
	deadline := time.Now().Add(interopStep)
	for time.Now().Before(deadline) {
		got, err = e.Position(env.ctx)
		if err == nil && got == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	env.t.Fatalf("%s: Position = %d, %v after %v; want %d; queue %v", e.Config().Identity, got, err, interopStep, n, env.queue(env.keyOf(e)))
}

func (env *interopEnv) keyOf(e *election.Elector) string { return e.Config().Key }

// waitContenders waits until key has n contenders.
func (env *interopEnv) waitContenders(key string, n int) {
	env.t.Helper()
	deadline := time.Now().Add(interopStep)
	var q []string
	for time.Now().Before(deadline) {
		q = env.queue(key)
		if len(q) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	env.t.Fatalf("%s has contenders %v after %v; want %d", key, q, interopStep, n)
}

// interopSeq matches a child name ending in a ZooKeeper sequence, as
// zkelect's contenders do.
var interopSeq = regexp.MustCompile(`(?:^|[^0-9])([0-9]{10})$`)

func seqOf(name string) int64 {
	m := interopSeq.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// queue returns key's contenders, lowest sequence first.
func (env *interopEnv) queue(key string) []string {
	children, _, err := env.admin.Children(key)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		env.t.Fatalf("children of %s: %v", key, err)
	}
	var q []string
	for _, c := range children {
		if seqOf(c) >= 0 {
			q = append(q, c)
		}
	}
	sort.Slice(q, func(i, j int) bool { return seqOf(q[i]) < seqOf(q[j]) })
	return q
}

// logQueue logs key's contenders with their data.
func (env *interopEnv) logQueue(key string) {
	env.t.Helper()
	var b strings.Builder
	for _, c := range env.queue(key) {
		d, st, err := env.admin.Get(key + "/" + c)
		if err != nil {
			fmt.Fprintf(&b, "\n  %s: %v", c, err)
			continue
		}
		fmt.Fprintf(&b, "\n  %s data=%q czxid=%d", c, d, st.Czxid)
	}
	env.t.Logf("queue of %s:%s", key, b.String())
}

// nodeOf returns the name and czxid of the only contender under key with
// data identity.
func (env *interopEnv) nodeOf(key, identity string) (string, int64) {
	env.t.Helper()
	var name string
	var czxid int64
	for _, c := range env.queue(key) {
		d, st, err := env.admin.Get(key + "/" + c)
		if errors.Is(err, zk.ErrNoNode) {
			continue
		}
		if err != nil {
			env.t.Fatalf("get %s/%s: %v", key, c, err)
		}
		if string(d) == identity {
			if name != "" {
				env.t.Fatalf("%s has two nodes with data %q: %s and %s", key, identity, name, c)
			}
			name, czxid = c, st.Czxid
		}
	}
	if name == "" {
		env.t.Fatalf("%s has no node with data %q; queue %v", key, identity, env.queue(key))
	}
	return name, czxid
}

// czxid returns the czxid of key/node.
func (env *interopEnv) czxid(key, node string) uint64 {
	env.t.Helper()
	_, st, err := env.admin.Get(key + "/" + node)
	if err != nil {
		env.t.Fatalf("get %s/%s: %v", key, node, err)
	}
	return uint64(st.Czxid)
}

// checkArrival checks that the nodes' sequences rise in the order given.
func (env *interopEnv) checkArrival(key string, nodes ...string) {
	env.t.Helper()
	for i := 1; i < len(nodes); i++ {
		if seqOf(nodes[i-1]) >= seqOf(nodes[i]) {
			env.t.Errorf("arrival order: %s is not before %s; queue %v", nodes[i-1], nodes[i], env.queue(key))
		}
	}
	if q := env.queue(key); strings.Join(q, ",") != strings.Join(nodes, ",") {
		env.t.Errorf("queue of %s = %v; want %v", key, q, nodes)
	}
}

// checkLeader checks that tenure's Leader reports identity with token.
func (env *interopEnv) checkLeader(e *election.Elector, key, identity string, token uint64) {
	env.t.Helper()
	l, err := e.Leader(env.ctx)
	if err != nil {
		env.t.Fatalf("Leader: %v", err)
	}
	if l.Vacant || l.Term.Identity != identity || l.Term.Token != token || l.Key != key || l.Term.Backend != zkelect.Name {
		env.t.Errorf("Leader = %+v; want %s with token %d on %s", l, identity, token, key)
	}
}

// peerEvent is one line a peer printed.
type peerEvent struct {
	what string // QUEUED, ACQUIRED, RELEASING or RELEASED
	node string // QUEUED: the name of its lock node
	at   int64  // the others: unix nanoseconds
}

// peerProc is one running peer process.
type peerProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan peerEvent // closed at the end of its output
	exited chan struct{}  // closed once it has exited; then err is set
	err    error
	stderr syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startPeer starts a peer contender named name on key. It is killed, if
// still running, when the test ends.
func (env *interopEnv) startPeer(peer interopPeer, key, name string) *peerProc {
	t := env.t
	t.Helper()
	cmd := peer.command(strings.Join(server.Endpoints(), ","), key, name)
	p := &peerProc{name: peer.kind + " " + name, cmd: cmd, events: make(chan peerEvent, 16), exited: make(chan struct{})}
	cmd.Stderr = &p.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	p.stdin = stdin
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			ev, ok := parsePeerLine(sc.Text(), name)
			if !ok {
				fmt.Fprintf(&p.stderr, "[unexpected stdout line %q]\n", sc.Text())
				continue
			}
			select {
			case p.events <- ev:
			default:
				fmt.Fprintf(&p.stderr, "[dropped stdout line %q]\n", sc.Text())
			}
		}
		close(p.events)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s (exit: %v) stderr:\n%s", p.name, p.err, p.stderr.String())
		}
	})
	return p
}

func parsePeerLine(line, name string) (peerEvent, bool) {
	f := strings.Fields(line)
	if len(f) != 3 || f[1] != name {
		return peerEvent{}, false
	}
	switch f[0] {
	case "QUEUED":
		return peerEvent{what: f[0], node: f[2]}, true
	case "ACQUIRED", "RELEASING", "RELEASED":
		n, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return peerEvent{}, false
		}
		return peerEvent{what: f[0], at: n}, true
	}
	return peerEvent{}, false
}

// expect waits for the peer's next line, which must be what.
func (p *peerProc) expect(t *testing.T, what string, timeout time.Duration) peerEvent {
	t.Helper()
	select {
	case ev, ok := <-p.events:
		if !ok {
			select {
			case <-p.exited:
			case <-time.After(interopStep):
			}
			t.Fatalf("%s ended its output (exit %v) before %s; stderr:\n%s", p.name, p.err, what, p.stderr.String())
		}
		if ev.what != what {
			t.Fatalf("%s printed %s (%+v), want %s", p.name, ev.what, ev, what)
		}
		return ev
	case <-time.After(timeout):
		t.Fatalf("%s printed no %s within %v; stderr:\n%s", p.name, what, timeout, p.stderr.String())
	}
	return peerEvent{}
}

// quiet checks that the peer prints nothing for d.
func (p *peerProc) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case ev, ok := <-p.events:
		if ok {
			t.Fatalf("%s printed %+v while it should wait", p.name, ev)
		}
		t.Fatalf("%s ended its output while it should wait; stderr:\n%s", p.name, p.stderr.String())
	case <-time.After(d):
	}
}

// release tells the peer to release the lock.
func (p *peerProc) release(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "release\n"); err != nil {
		t.Fatalf("%s: write release: %v", p.name, err)
	}
}

// waitExit waits for the peer to exit 0 after its last line.
func (p *peerProc) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(interopStep):
		t.Fatalf("%s did not exit within %v of its release", p.name, interopStep)
	}
	if p.err != nil {
		t.Fatalf("%s exited with %v; stderr:\n%s", p.name, p.err, p.stderr.String())
	}
	if ev, ok := <-p.events; ok {
		t.Errorf("%s printed %+v after RELEASED", p.name, ev)
	}
}
