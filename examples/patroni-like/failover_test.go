package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/fence"
)

// managerEnv makes the test binary run a manager (the arguments after the
// test flags) instead of the tests: the end-to-end test runs every manager
// as a process of its own, so that it can SIGKILL one.
const managerEnv = "PATRONI_LIKE_TEST_MANAGER"

func TestMain(m *testing.M) {
	// A manager, also one a test runs in this process, starts its
	// watchdog as this very binary (see startWatchdog).
	if os.Getenv(managerEnv) != "" || len(os.Args) > 1 && os.Args[1] == watchdogCommand {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// Test timing: TTL 3 s (the fastest failover the example's defaults allow
// comfortably on a loaded machine), loop_wait 500 ms; TestFailover_EndToEnd
// runs with endToEndTTL.
const (
	testTTL = 3 * time.Second
	// endToEndTTL is TestFailover_EndToEnd's TTL. Its cut-off primary's
	// fence must finish its clean shutdown within the drain window the
	// manager gives it: 3/4 of StopTimeout, itself 3/4 of DeadlineMargin,
	// TTL/5 by default, so 0.1125 × TTL. The clean shutdown took 38–41 ms
	// on the machine the test was written on, and 430–500 ms on one whose
	// process exits take 6 ms each (2026-12-01: fork, exit and wait of a
	// bare child, 7.2 ms on average), under the test's writer and prober:
	// a 3 s TTL (337 ms) failed there every time. 10 s gives 1.125 s;
	// with 8 s (900 ms) the fences there took 381–586 ms.
	endToEndTTL  = 10 * time.Second
	testLoopWait = 500 * time.Millisecond
	// etcdExpiry is etcd's lease-expiry check period: a dead leader's key
	// goes up to this long after its TTL (docs/guarantees.md).
	etcdExpiry = 500 * time.Millisecond
	// slack absorbs scheduling noise on a shared two-core machine (watch
	// delivery, a read, process start-up), on top of the stated bound.
	slack = 2 * time.Second
)

// ack is one write the writer saw committed.
type ack struct {
	node       string
	term       uint64
	id         int64
	start, end time.Time
}

// writer writes a row every few milliseconds through whichever member
// answers 200 on /primary, under the term that member reports, and records
// every commit.
type writer struct {
	c *localCluster

	mu     sync.Mutex
	acks   []ack
	errors int
}

func (w *writer) run(ctx context.Context) {
	var conn *pgx.Conn
	var primary Status
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		if conn == nil {
			ps := w.c.primaries(ctx)
			if len(ps) != 1 {
				sleep(ctx, 20*time.Millisecond)
				continue
			}
			primary = ps[0]
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := w.c.connect(cctx, primary.Name)
			cancel()
			if err != nil {
				continue
			}
			conn = c
		}
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		id, err := Write(wctx, conn, primary.Term, fmt.Sprintf("w%d", i))
		cancel()
		end := time.Now()
		if err != nil {
			w.mu.Lock()
			w.errors++
			w.mu.Unlock()
			conn.Close(context.Background())
			conn = nil
			continue
		}
		w.mu.Lock()
		w.acks = append(w.acks, ack{primary.Name, primary.Term, id, start, end})
		w.mu.Unlock()
		sleep(ctx, 10*time.Millisecond)
	}
}

func (w *writer) snapshot() []ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ack(nil), w.acks...)
}

// waitAck waits for a commit under term.
func (w *writer) waitAck(ctx context.Context, t *testing.T, term uint64, timeout time.Duration) ack {
	t.Helper()
	var got ack
	err := waitFor(ctx, timeout, fmt.Sprintf("a write committed under term %d", term), func(context.Context) bool {
		for _, a := range w.snapshot() {
			if a.term == term {
				got = a
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// prober tries, every 25 ms, a read-write transaction on every member
// directly (past the manager's fence table: a plain INSERT), and records
// the rounds in which more than one member accepted it.
type prober struct {
	c      *localCluster
	mu     sync.Mutex
	rounds int
	double []string
}

func (p *prober) run(ctx context.Context) {
	conns := map[string]*pgx.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		var ok []string
		for _, n := range p.c.names() {
			if conns[n] == nil {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				c, err := p.c.connect(cctx, n)
				cancel()
				if err != nil {
					continue
				}
				conns[n] = c
			}
			pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err := pgx.BeginTxFunc(pctx, conns[n], pgx.TxOptions{AccessMode: pgx.ReadWrite}, func(tx pgx.Tx) error {
				_, err := tx.Exec(pctx, `INSERT INTO probes (node) VALUES (current_setting('cluster_name'))`)
				return err
			})
			cancel()
			if err == nil {
				ok = append(ok, n)
			} else if conns[n].IsClosed() || errors.Is(err, context.DeadlineExceeded) {
				conns[n].Close(context.Background())
				delete(conns, n)
			}
		}
		p.mu.Lock()
		p.rounds++
		if len(ok) > 1 {
			p.double = append(p.double, fmt.Sprintf("%s: %v", time.Now().Format(time.RFC3339Nano), ok))
		}
		p.mu.Unlock()
		sleep(ctx, 25*time.Millisecond)
	}
}

// history is the election history the managers reported.
type history struct{ events []Event }

func (h history) find(event, node string, term uint64) (time.Time, bool) {
	e, ok := h.event(event, node, term)
	return e.At, ok
}

func (h history) event(event, node string, term uint64) (Event, bool) {
	for _, e := range h.events {
		if e.Event == event && e.Node == node && e.Term == term {
			return e, true
		}
	}
	return Event{}, false
}

// tenureSpan is one term as the history shows it: who, from when PostgreSQL
// could first accept a write (elected, before pg_promote) until it was
// fenced (or, for a killed member, until its processes were dead).
type tenureSpan struct {
	node       string
	term       uint64
	from, till time.Time // till zero: still open
}

// TestFailover_EndToEnd runs three managers as separate processes, each
// with its own PostgreSQL, on an embedded etcd, and checks, in order:
// bootstrap (one primary, two streaming standbys, a row written on the
// primary read on both standbys, /cluster's view); a crash of the
// primary's manager and PostgreSQL (a standby promoted within TTL + etcd's
// expiry check + promotion time, writes under a higher term, a stale-term
// write refused); the crashed member's return as a standby (pg_rewind); a
// primary cut off from etcd (it fences its PostgreSQL before another
// member is promoted) and its return; and throughout, that no two members
// ever accepted writes at once: every commit's term against the history.
func TestFailover_EndToEnd(t *testing.T) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, _ := testClusterTTL(t, 3, endToEndTTL)
	startAll(t, c)

	// 1. Bootstrap: one primary, two streaming standbys.
	p1, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names() {
		if n == p1.Name {
			continue
		}
		if err := c.waitReplica(ctx, 90*time.Second, n); err != nil {
			t.Fatal(err)
		}
		if code, _, err := c.get(ctx, n, "/primary"); err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("GET /primary on standby %s: %d, %v; want 503", n, code, err)
		}
	}
	if code, _, err := c.get(ctx, p1.Name, "/replica"); err != nil || code != http.StatusServiceUnavailable {
		t.Errorf("GET /replica on primary %s: %d, %v; want 503", p1.Name, code, err)
	}
	t.Logf("bootstrap: %s primary under term %d, both standbys streaming, %v after start", p1.Name, p1.Term, time.Since(began).Round(time.Millisecond))
	conn, err := c.connect(ctx, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE probes (node text, at timestamptz DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, conn, p1.Term, "first")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names() {
		if n != p1.Name {
			readRow(ctx, t, c, n, id, p1.Term)
		}
	}
	checkClusterView(ctx, t, c, p1)

	w := &writer{c: c}
	pr := &prober{c: c}
	bg, stopBG := context.WithCancel(ctx)
	var bgDone sync.WaitGroup
	bgDone.Add(2)
	go func() { defer bgDone.Done(); w.run(bg) }()
	go func() { defer bgDone.Done(); pr.run(bg) }()
	stopped := false
	stopBackground := func() {
		if !stopped {
			stopped = true
			stopBG()
			bgDone.Wait()
		}
	}
	defer stopBackground()
	w.waitAck(ctx, t, p1.Term, 30*time.Second)

	// 2. Crash: SIGKILL the primary's manager and its PostgreSQL.
	killedAt := time.Now()
	c.kill(p1.Name)
	// Its PostgreSQL must be gone with it: no connection is accepted.
	if err := waitFor(ctx, 10*time.Second, p1.Name+"'s PostgreSQL refusing connections", func(ctx context.Context) bool {
		conn, err := c.connect(ctx, p1.Name)
		if err == nil {
			conn.Close(ctx)
		}
		return err != nil
	}); err != nil {
		t.Fatal(err)
	}
	deadAt := time.Now()
	p2, err := c.waitPrimary(ctx, 60*time.Second, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Term <= p1.Term {
		t.Errorf("new primary %s has term %d, not above the old %d", p2.Name, p2.Term, p1.Term)
	}
	h := history{c.eventLog()}
	elected2, ok1 := h.find("elected", p2.Name, p2.Term)
	open2, ok2 := h.find("open", p2.Name, p2.Term)
	if !ok1 || !ok2 {
		t.Fatalf("no elected/open events for %s term %d", p2.Name, p2.Term)
	}
	promotion := open2.Sub(elected2)
	bound := endToEndTTL + etcdExpiry + promotion + slack
	t.Logf("crash failover: %s → %s (terms %d → %d): elected %v and open for writes %v after the kill (promotion %v); bound TTL %v + etcd expiry %v + promotion + slack %v = %v",
		p1.Name, p2.Name, p1.Term, p2.Term, elected2.Sub(killedAt).Round(time.Millisecond), open2.Sub(killedAt).Round(time.Millisecond),
		promotion.Round(time.Millisecond), endToEndTTL, etcdExpiry, slack, bound.Round(time.Millisecond))
	if took := open2.Sub(killedAt); took > bound {
		t.Errorf("failover took %v, above the bound %v", took, bound)
	}
	w.waitAck(ctx, t, p2.Term, 30*time.Second)
	// A client still holding the old term is refused by the fence.
	if conn, err := c.connect(ctx, p2.Name); err != nil {
		t.Error(err)
	} else {
		_, err := Write(ctx, conn, p1.Term, "stale")
		conn.Close(ctx)
		if !errors.Is(err, fence.ErrStale) {
			t.Errorf("write under the old term %d on the new primary: %v, want fence.ErrStale", p1.Term, err)
		}
	}

	// 3. The old member comes back and rejoins as a standby.
	rejoinAt := time.Now()
	if err := c.start(p1.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.waitReplica(ctx, 90*time.Second, p1.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s rejoined as a standby of %s %v after its restart", p1.Name, p2.Name, time.Since(rejoinAt).Round(time.Millisecond))
	a := w.waitAck(ctx, t, p2.Term, 30*time.Second)
	readRow(ctx, t, c, p1.Name, a.id, p2.Term)

	// 4. Cut the primary's manager off from etcd: it must fence its
	// PostgreSQL before another member is promoted.
	cutAt := time.Now()
	c.proxies[p2.Name].Blackhole()
	p3, err := c.waitPrimary(ctx, 60*time.Second, p2.Name)
	if err != nil {
		t.Fatal(err)
	}
	h = history{c.eventLog()}
	fenced2, okF := h.find("fenced", p2.Name, p2.Term)
	elected3, okE := h.find("elected", p3.Name, p3.Term)
	promoting3, okP := h.find("promoting", p3.Name, p3.Term)
	if !okF || !okE || !okP {
		t.Fatalf("missing events: fenced %s/%d %v, elected %s/%d %v, promoting %v", p2.Name, p2.Term, okF, p3.Name, p3.Term, okE, okP)
	}
	t.Logf("cut-off failover: %s fenced its PostgreSQL %v after the cut; %s elected %v and promoting %v after the cut: fenced %v before the promotion began",
		p2.Name, fenced2.Sub(cutAt).Round(time.Millisecond), p3.Name, elected3.Sub(cutAt).Round(time.Millisecond),
		promoting3.Sub(cutAt).Round(time.Millisecond), promoting3.Sub(fenced2).Round(time.Millisecond))
	if !fenced2.Before(elected3) || !fenced2.Before(promoting3) {
		t.Errorf("%s fenced at %v, not before %s was elected (%v) and promoted (%v)", p2.Name, fenced2, p3.Name, elected3, promoting3)
	}
	if p3.Term <= p2.Term {
		t.Errorf("term went from %d to %d", p2.Term, p3.Term)
	}
	w.waitAck(ctx, t, p3.Term, 30*time.Second)
	c.proxies[p2.Name].Heal()
	healAt := time.Now()
	if err := c.waitReplica(ctx, 90*time.Second, p2.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s rejoined as a standby of %s %v after its link healed", p2.Name, p3.Name, time.Since(healAt).Round(time.Millisecond))
	w.waitAck(ctx, t, p3.Term, 30*time.Second)
	stopBackground()

	// 5. Never two members accepting writes.
	h = history{c.eventLog()}
	spans := checkSpans(t, h, map[string]time.Time{fmt.Sprint(p1.Term): deadAt})
	checkAcks(t, w.snapshot(), spans)
	lost := checkRows(ctx, t, c, p3.Name, spans, w.snapshot())
	// The cut-off primary's fence was a clean shutdown within its drain
	// window: its standbys confirmed all its WAL before it was fenced, and
	// so before the new primary was elected. Not one acknowledged commit of
	// its term may be missing.
	ev, _ := h.event("fenced", p2.Name, p2.Term)
	t.Logf("the cut-off %s's fence took %.1f ms; drained: %v; acknowledged commits of its term %d missing: %d", p2.Name, ev.Took*1000, ev.Drained, p2.Term, lost[p2.Term])
	if !ev.Drained {
		t.Errorf("the fence of cut-off %s (term %d) did not drain in time: its last commits may not have reached the standbys", p2.Name, p2.Term)
	} else if lost[p2.Term] > 0 {
		t.Errorf("%d commits acknowledged under the cut-off term %d are missing on the final primary, though its fence drained", lost[p2.Term], p2.Term)
	}
	pr.mu.Lock()
	t.Logf("prober: %d rounds of direct read-write transactions on all three members; rounds with two members accepting: %d", pr.rounds, len(pr.double))
	if len(pr.double) > 0 {
		t.Errorf("two members accepted writes in the same round: %v", pr.double)
	}
	pr.mu.Unlock()
	acks := w.snapshot()
	t.Logf("writer: %d commits, %d failed attempts; whole test %v", len(acks), w.errors, time.Since(began).Round(time.Millisecond))
}

func pgLogPath(dir, n string) string { return dir + "/" + n + "/data.log" }

// testCluster makes a local cluster of n members, each manager a copy of
// this test binary, with the test timings, its events in the test's log,
// in a directory of the test's (returned); none started. At the test's
// end it closes the cluster, fails the test on a data race a manager
// logged (under -race), and names the logs of a failed test.
func testCluster(t *testing.T, n int) (*localCluster, string) {
	t.Helper()
	return testClusterTTL(t, n, testTTL)
}

// testClusterTTL is testCluster with the given TTL.
func testClusterTTL(t *testing.T, n int, ttl time.Duration) (*localCluster, string) {
	t.Helper()
	if _, err := findBinDir(); err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's postgresql package)", err)
	}
	dir := t.TempDir()
	c, err := newLocalCluster(dir, n, ttl, testLoopWait, func(cfg string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "--config", cfg)
		cmd.Env = append(os.Environ(), managerEnv+"=1")
		return cmd
	}, func(ev Event) {
		t.Logf("event: %s %-12s term %d %s%s%s", ev.Node, ev.Event, ev.Term, ev.Cause, ev.Reason, map[bool]string{true: " (drained)"}[ev.Drained])
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.close()
		for _, n := range c.names() {
			// Under -race, a data race in a manager process shows in its log.
			if b, err := os.ReadFile(c.managerLog(n)); err == nil && strings.Contains(string(b), "DATA RACE") {
				t.Errorf("data race in %s's manager: see %s", n, c.managerLog(n))
			}
		}
		// PATRONI_LIKE_KEEP_LOGS=DIR keeps a failed test's directory
		// (logs, data directories) as DIR, which must not exist.
		if keep := os.Getenv("PATRONI_LIKE_KEEP_LOGS"); t.Failed() && keep != "" {
			if err := exec.Command("cp", "-r", dir, keep).Run(); err != nil {
				t.Logf("PATRONI_LIKE_KEEP_LOGS: %v", err)
			}
		}
		if t.Failed() {
			for _, n := range c.names() {
				t.Logf("logs of %s: %s, %s", n, c.managerLog(n), pgLogPath(dir, n))
			}
		}
	})
	return c, dir
}

// startAll starts every member of c.
func startAll(t *testing.T, c *localCluster) {
	t.Helper()
	for _, n := range c.names() {
		if err := c.start(n); err != nil {
			t.Fatal(err)
		}
	}
}

// readRow waits until row id, under term, can be read on member n.
func readRow(ctx context.Context, t *testing.T, c *localCluster, n string, id int64, term uint64) {
	t.Helper()
	err := waitFor(ctx, 30*time.Second, fmt.Sprintf("row %d on %s", id, n), func(ctx context.Context) bool {
		conn, err := c.connect(ctx, n)
		if err != nil {
			return false
		}
		defer conn.Close(context.Background())
		var got int64
		var inRecovery bool
		if conn.QueryRow(ctx, `SELECT term, pg_is_in_recovery() FROM rows WHERE id = $1`, id).Scan(&got, &inRecovery) != nil {
			return false
		}
		if uint64(got) != term || !inRecovery {
			t.Errorf("row %d on %s: term %d (want %d), in recovery %v (want a standby)", id, n, got, term, inRecovery)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

// checkClusterView checks GET /cluster on every member against what the
// test knows.
func checkClusterView(ctx context.Context, t *testing.T, c *localCluster, primary Status) {
	t.Helper()
	for _, n := range c.names() {
		cl, err := c.clusterView(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		if cl.Leader != primary.Name || cl.Term != primary.Term || len(cl.Members) != 3 {
			t.Errorf("/cluster on %s: leader %q term %d, %d members; want %s, %d, 3", n, cl.Leader, cl.Term, len(cl.Members), primary.Name, primary.Term)
		}
		for _, m := range cl.Members {
			want := RoleReplica
			if m.Name == primary.Name {
				want = RolePrimary
			}
			if m.Role != want {
				t.Errorf("/cluster on %s: %s is %q, want %q", n, m.Name, m.Role, want)
			}
			if want == RoleReplica && (m.Lag == nil || *m.Lag < 0) {
				t.Errorf("/cluster on %s: standby %s has lag %v, want a byte count", n, m.Name, m.Lag)
			}
		}
	}
}

// checkSpans builds each term's span of writability from the history and
// checks that they follow each other without overlap, terms growing.
// killed gives, by term, when a killed member's processes were dead.
func checkSpans(t *testing.T, h history, killed map[string]time.Time) []tenureSpan {
	t.Helper()
	var spans []tenureSpan
	for _, e := range h.events {
		if e.Event != "elected" {
			continue
		}
		s := tenureSpan{node: e.Node, term: e.Term, from: e.At}
		if till, ok := h.find("fenced", e.Node, e.Term); ok {
			s.till = till
		} else if till, ok := h.find("yield", e.Node, e.Term); ok {
			s.till = till // never promoted: writable at no time, in fact
		} else if till, ok := killed[fmt.Sprint(e.Term)]; ok {
			s.till = till
		}
		spans = append(spans, s)
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	for i, s := range spans {
		t.Logf("history: term %d on %s from %s till %s", s.term, s.node, s.from.Format("15:04:05.000"), fmtTime(s.till))
		if i == 0 {
			continue
		}
		prev := spans[i-1]
		if s.term <= prev.term {
			t.Errorf("term %d (%s) elected after term %d (%s): terms must grow", s.term, s.node, prev.term, prev.node)
		}
		if prev.till.IsZero() || !prev.till.Before(s.from) {
			t.Errorf("term %d on %s (till %s) overlaps term %d on %s (from %s)", prev.term, prev.node, fmtTime(prev.till), s.term, s.node, fmtTime(s.from))
		}
	}
	if len(spans) < 3 {
		t.Errorf("history has %d terms, want at least 3", len(spans))
	}
	return spans
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "(open)"
	}
	return t.Format("15:04:05.000")
}

// checkAcks checks every commit the writer saw: its term is one the
// history shows on the member it committed on, and the commit happened
// within that term's span.
func checkAcks(t *testing.T, acks []ack, spans []tenureSpan) {
	t.Helper()
	for _, a := range acks {
		var span *tenureSpan
		for i := range spans {
			if spans[i].term == a.term {
				span = &spans[i]
			}
		}
		switch {
		case span == nil:
			t.Errorf("row %d committed under term %d, which is in no history", a.id, a.term)
		case span.node != a.node:
			t.Errorf("row %d committed on %s under term %d, which %s held", a.id, a.node, a.term, span.node)
		case a.end.Before(span.from) || (!span.till.IsZero() && a.start.After(span.till)):
			t.Errorf("row %d committed on %s under term %d between %s and %s, outside the term (%s–%s)",
				a.id, a.node, a.term, fmtTime(a.start), fmtTime(a.end), fmtTime(span.from), fmtTime(span.till))
		}
	}
}

// checkRows reads every row on the final primary: each carries a term of
// the history, written on the member that held it, and terms never go back
// in commit order. Acknowledged rows missing there are counted by term:
// replication is asynchronous, so an ended term may lose its last commits
// (README, Limits), but the final primary's own term loses none.
func checkRows(ctx context.Context, t *testing.T, c *localCluster, primary string, spans []tenureSpan, acks []ack) (lost map[uint64]int) {
	t.Helper()
	conn, err := c.connect(ctx, primary)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id, term, node FROM rows ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	holder := map[uint64]string{}
	for _, s := range spans {
		holder[s.term] = s.node
	}
	var n int
	var last uint64
	terms := map[uint64]int{}
	present := map[int64]bool{}
	for rows.Next() {
		var id, term int64
		var node string
		if err := rows.Scan(&id, &term, &node); err != nil {
			t.Fatal(err)
		}
		n++
		present[id] = true
		terms[uint64(term)]++
		if h, ok := holder[uint64(term)]; !ok || h != node {
			t.Errorf("row %d: term %d on %s; the history says term %d was %q's", id, term, node, term, h)
		}
		if uint64(term) < last {
			t.Errorf("row %d: term %d after a row of term %d", id, term, last)
		}
		last = uint64(term)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("final primary %s holds %d rows, by term: %v", primary, n, terms)
	var final uint64
	for _, s := range spans {
		final = max(final, s.term)
	}
	lost = map[uint64]int{}
	for _, a := range acks {
		if !present[a.id] {
			lost[a.term]++
		}
	}
	t.Logf("acknowledged commits missing on the final primary, by term: %v (of %d acknowledged; an ended term's last commits that its standbys had not received, which asynchronous replication loses at failover: README, Limits)", lost, len(acks))
	if lost[final] > 0 {
		t.Errorf("%d commits acknowledged under the final term %d are missing on its own primary", lost[final], final)
	}
	return lost
}
