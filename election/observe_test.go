package election_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// newElector returns an elector on its own client of srv, closed when the
// test ends.
func newElector(t *testing.T, srv *electiontest.Memory, key, id string, ttl time.Duration, opts ...election.Option) (*election.Elector, *electiontest.Client) {
	t.Helper()
	c := srv.Client()
	e, err := election.New(c, election.Config{Key: key, Identity: id, TTL: ttl}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e, c
}

// setup starts an in-memory server and returns it, a key of the test and
// a context that ends with the test.
func setup(t *testing.T) (*electiontest.Memory, string, context.Context) {
	t.Helper()
	srv := electiontest.NewMemory()
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return srv, electiontest.Key(t), ctx
}

// value returns the value of the first series of the gauge or counter name
// in reg, or -1 when reg has none.
func value(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func newMetrics(t *testing.T) (*election.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := election.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// failovers returns how many failovers reg's histogram holds.
func failovers(t *testing.T, reg *prometheus.Registry) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tenure_failover_seconds" {
			var n uint64
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	return 0
}

// observer keeps the latest value of an Observe channel.
type observer struct {
	mu   sync.Mutex
	last tenure.Leader
	done chan struct{}
}

func observe(ctx context.Context, e *election.Elector) *observer {
	o := &observer{done: make(chan struct{})}
	ch := e.Observe(ctx)
	go func() {
		defer close(o.done)
		for l := range ch {
			o.mu.Lock()
			o.last = l
			o.mu.Unlock()
		}
	}()
	return o
}

func (o *observer) sees(vacant bool, token uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.last.Vacant == vacant && o.last.Term.Token == token
}

// TestFailover_RecordedOnceHoweverManyObservers: one failover (a leader
// resigns, the key stays vacant, another is elected) is one sample of
// tenure_failover_seconds, whatever the number of observers of the elector
// that has the metrics. Each Observe recorded its own sample before, so Run
// with metrics plus one Observe of the program's counted each failover
// twice.
func TestFailover_RecordedOnceHoweverManyObservers(t *testing.T) {
	srv, key, octx := setup(t)
	m, reg := newMetrics(t)
	watcher, _ := newElector(t, srv, key, "watcher", time.Second, election.WithMetrics(m))
	ctx, cancel := context.WithCancel(octx)
	obs := []*observer{observe(ctx, watcher), observe(ctx, watcher), observe(ctx, watcher)}
	defer func() {
		cancel()
		for _, o := range obs {
			<-o.done
		}
	}()
	all := func(vacant bool, token uint64) func() bool {
		return func() bool {
			for _, o := range obs {
				if !o.sees(vacant, token) {
					return false
				}
			}
			return true
		}
	}
	a, _ := newElector(t, srv, key, "a", time.Second)
	b, _ := newElector(t, srv, key, "b", time.Second)
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	electiontest.WaitFor(t, 5*time.Second, "every observer to see a", all(false, ta.Token))
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	electiontest.WaitFor(t, 5*time.Second, "every observer to see the vacancy", all(true, 0))
	tb, err := b.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	electiontest.WaitFor(t, 5*time.Second, "every observer to see b", all(false, tb.Token))
	if n := failovers(t, reg); n != 1 {
		t.Fatalf("one failover seen by %d observers: tenure_failover_seconds holds %d samples, want 1", len(obs), n)
	}
	// A second failover is counted too.
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	electiontest.WaitFor(t, 5*time.Second, "every observer to see the second vacancy", all(true, 0))
	ta, err = a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	electiontest.WaitFor(t, 5*time.Second, "every observer to see a again", all(false, ta.Token))
	if n := failovers(t, reg); n != 2 {
		t.Fatalf("two failovers: %d samples, want 2", n)
	}
}

// TestSuspended_OnlyForALeader: a candidate that does not lead is never
// "suspended", whatever its session's renewals; a leader whose renewals
// fail is. The follower's gauge read 1 before, while /status said
// "campaigning".
func TestSuspended_OnlyForALeader(t *testing.T) {
	srv, key, ctx := setup(t)
	const ttl = 3 * time.Second // renewals every 1 s, deadline 2.4 s after one
	lm, lreg := newMetrics(t)
	leader, lc := newElector(t, srv, key, "leader", ttl, election.WithMetrics(lm))
	if _, err := leader.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	fm, freg := newMetrics(t)
	follower, fc := newElector(t, srv, key, "follower", ttl, election.WithMetrics(fm))
	waiting := make(chan error, 1)
	wctx, stopWaiting := context.WithCancel(ctx)
	go func() { _, err := follower.Campaign(wctx); waiting <- err }()
	electiontest.WaitFor(t, 5*time.Second, "the follower to queue", func() bool { return srv.Entries(key) == 2 })

	failures := func(reg *prometheus.Registry) float64 { return value(t, reg, "tenure_watchdog_failures_total") }
	gauge := func(reg *prometheus.Registry) float64 { return value(t, reg, "tenure_suspended") }

	fc.Crash() // the follower's renewals fail from now on
	electiontest.WaitFor(t, 5*time.Second, "a failed renewal of the follower", func() bool { return failures(freg) > 0 })
	if follower.Deadline().Before(time.Now()) {
		t.Skip("the follower's deadline passed before the check; the machine is too slow for this test")
	}
	if follower.Suspended() || gauge(freg) != 0 {
		t.Errorf("a follower whose renewal failed: Suspended %v, tenure_suspended %v; want false and 0", follower.Suspended(), gauge(freg))
	}
	if st := follower.Status(ctx); st.State != "campaigning" {
		t.Errorf("follower's state %q, want campaigning", st.State)
	}
	stopWaiting()
	<-waiting

	lc.Crash()
	electiontest.WaitFor(t, 5*time.Second, "a failed renewal of the leader", func() bool { return failures(lreg) > 0 })
	if !leader.IsLeader() {
		t.Skip("the leader's deadline passed before the check; the machine is too slow for this test")
	}
	if !leader.Suspended() || gauge(lreg) != 1 {
		t.Errorf("a leader whose renewal failed: Suspended %v, tenure_suspended %v; want true and 1", leader.Suspended(), gauge(lreg))
	}
}

// TestDeadline_ZeroOnceTheSessionEnded: after the server expired the
// session, Deadline, /status and the lease gauge say there is no lease.
// They kept the dead session's deadline before, counting down to 0.
func TestDeadline_ZeroOnceTheSessionEnded(t *testing.T) {
	srv, key, ctx := setup(t)
	m, reg := newMetrics(t)
	a, _ := newElector(t, srv, key, "a", 3*time.Second, election.WithMetrics(m))
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Deadline().IsZero() {
		t.Fatal("a leader has no deadline")
	}
	if !srv.ExpireSession(key, "a") {
		t.Fatal("no session to expire")
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the term did not end within 5 s of its session's expiry")
	}
	if err := a.Err(); !errors.Is(err, tenure.ErrSessionExpired) {
		t.Fatalf("term ended with %v, want ErrSessionExpired", err)
	}
	// The lease notices at its next renewal, within RenewInterval (1 s).
	electiontest.WaitFor(t, 3*time.Second, "Deadline to be zero", func() bool { return a.Deadline().IsZero() })
	if st := a.Status(ctx); !st.Deadline.IsZero() || st.LeaseRemainingSeconds != 0 {
		t.Errorf("Status after the session ended: deadline %v, %v s remaining; want none", st.Deadline, st.LeaseRemainingSeconds)
	}
	if v := value(t, reg, "tenure_lease_remaining_seconds"); v != 0 {
		t.Errorf("tenure_lease_remaining_seconds = %v after the session ended, want 0", v)
	}
}

// TestMetrics_ClosedElectorsLeaveNoSeries: a process that locks one key
// per job, each with its own Elector on one Metrics, keeps series only for
// the Electors still open, once their final counts were collected. Before,
// every closed key kept its 9 counter and 3 histogram series (11,000
// series after 1,000 jobs).
func TestMetrics_ClosedElectorsLeaveNoSeries(t *testing.T) {
	srv, key, ctx := setup(t)
	m, reg := newMetrics(t)
	series := func() map[string]int { // by key label
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		by := map[string]int{}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				for _, l := range s.GetLabel() {
					if l.GetName() == "key" {
						by[l.GetValue()]++
					}
				}
			}
		}
		return by
	}
	live, _ := newElector(t, srv, key+"/live", "live", 3*time.Second, election.WithMetrics(m))
	if _, err := live.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	liveSeries := series()[key+"/live"]
	for i := range 50 {
		mu, err := election.NewMutex(srv.Client(), election.Config{Key: fmt.Sprintf("%s/job-%d", key, i), Identity: "worker", TTL: 3 * time.Second},
			election.WithMetrics(m))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mu.Lock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := mu.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := mu.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The next scrape (or a textfile written after Close) still has
	// their final counts; the one after does not.
	if n := series()[key+"/job-0"]; n == 0 {
		t.Errorf("the first scrape after Close has no series of a closed Elector's key: its final counts are lost")
	}
	by := series()
	if by[key+"/live"] != liveSeries || liveSeries == 0 {
		t.Errorf("the open Elector's key has %d series, want the %d it had", by[key+"/live"], liveSeries)
	}
	delete(by, key+"/live")
	for k, n := range by {
		t.Errorf("%d series left for %d closed Electors' keys (want none), for example %d for %s", total(by), len(by), n, k)
		break
	}
	// A new Elector on a closed key reports it again.
	e, _ := newElector(t, srv, key+"/job-0", "worker", 3*time.Second, election.WithMetrics(m))
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if n := series()[key+"/job-0"]; n != liveSeries {
		t.Errorf("a new Elector on a closed key has %d series, want %d", n, liveSeries)
	}

	// A new Elector on a key closed and not collected since takes its
	// series over: the counts go on, none is lost.
	elected := func(k string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "tenure_transitions_total" {
				continue
			}
			for _, s := range mf.GetMetric() {
				var ok, why bool
				for _, l := range s.GetLabel() {
					ok = ok || l.GetName() == "key" && l.GetValue() == k
					why = why || l.GetName() == "reason" && l.GetValue() == "elected"
				}
				if ok && why {
					return s.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	k := key + "/again"
	for i := range 2 {
		e, err := election.New(srv.Client(), election.Config{Key: k, Identity: "worker", TTL: 3 * time.Second}, election.WithMetrics(m))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := e.Close(ctx); err != nil { // retired, not collected
				t.Fatal(err)
			}
		} else {
			defer e.Close(ctx)
		}
	}
	if n := elected(k); n != 2 {
		t.Errorf("elections counted on a key whose Elector was closed and replaced before a scrape: %v, want 2", n)
	}
}

func total(by map[string]int) (n int) {
	for _, v := range by {
		n += v
	}
	return n
}

// TestNew_KeyNotUTF8IsAConfigError: with metrics on, a key that is not
// valid UTF-8 (the in-memory backend accepts any) made New panic in
// Prometheus's label check.
func TestNew_KeyNotUTF8IsAConfigError(t *testing.T) {
	srv, _, _ := setup(t)
	m, _ := newMetrics(t)
	for _, opts := range [][]election.Option{nil, {election.WithMetrics(m)}} {
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("panic: %v", r)
				}
			}()
			_, err = election.New(srv.Client(), election.Config{Key: "bad\xff", Identity: "a"}, opts...)
		}()
		if !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "UTF-8") {
			t.Errorf("New with key \"bad\\xff\" (%d options): %v, want ErrInvalidConfig naming UTF-8", len(opts), err)
		}
	}
}

// TestNewMetrics_TwiceOnOneRegistry is a configuration error, not a panic.
func TestNewMetrics_TwiceOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := election.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := election.NewMetrics(reg); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("second NewMetrics on one registry: %v, want ErrInvalidConfig", err)
	}
	var none *prometheus.Registry // var reg *prometheus.Registry; if enabled {reg = ...}
	if _, err := election.NewMetrics(none); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("NewMetrics(a nil *prometheus.Registry): %v, want ErrInvalidConfig", err) // a panic before
	}
	if _, err := election.NewMetrics(nil); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("NewMetrics(nil): %v, want ErrInvalidConfig", err)
	}
}

// fakeClock is a Clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// TestDeadline_IsSendTimePlusTTLMinusMargin: the lease deadline is the send
// time of the last acknowledged renewal + TTL − DeadlineMargin, on the
// elector's clock; the leader leads until that instant and not after.
func TestDeadline_IsSendTimePlusTTLMinusMargin(t *testing.T) {
	srv, key, ctx := setup(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := &fakeClock{now: t0}
	const ttl, renew, margin = 3 * time.Second, 200 * time.Millisecond, 500 * time.Millisecond
	c := srv.Client()
	a, err := election.New(c, election.Config{Key: key, Identity: "a", TTL: ttl, RenewInterval: renew, DeadlineMargin: margin}, election.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := a.Deadline(), t0.Add(ttl-margin); !got.Equal(want) {
		t.Fatalf("deadline after a session opened at t0: t0%+v, want t0%+v", got.Sub(t0), want.Sub(t0))
	}
	// A renewal sent at t1 moves it to t1 + TTL − margin.
	t1 := t0.Add(700 * time.Millisecond)
	clock.set(t1)
	electiontest.WaitFor(t, 5*time.Second, "a renewal sent at t1", func() bool { return a.Deadline().Equal(t1.Add(ttl - margin)) })
	// The session keeps renewing with send time t1: the leader leads until
	// the deadline, and not at it.
	clock.set(t1.Add(ttl - margin - time.Nanosecond))
	if !a.IsLeader() {
		t.Fatal("not leader 1 ns before the deadline")
	}
	clock.set(t1.Add(ttl - margin))
	if a.IsLeader() {
		t.Fatal("still leader at the deadline")
	}
}

// TestDeadline_CampaignThatFindsItPassedKeepsTheMargin: a Campaign that
// finds the lease past its deadline before the lease's own timer has fired
// retires the lease. That must end the term as the deadline does
// (ErrLeaseExpired), and keep the session, and so the entry, for
// DeadlineMargin: the leader's work needs that time to stop before another
// candidate can be elected. Before, the term ended as ErrClosed and the
// session was closed at once: b was elected 134 µs later.
func TestDeadline_CampaignThatFindsItPassedKeepsTheMargin(t *testing.T) {
	srv, key, ctx := setup(t)
	t0 := time.Now()
	clock := &fakeClock{now: t0}
	const ttl, renew, margin = 3 * time.Second, time.Second, 800 * time.Millisecond
	a, err := election.New(srv.Client(), election.Config{Key: key, Identity: "a", TTL: ttl, RenewInterval: renew, DeadlineMargin: margin}, election.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, _ := newElector(t, srv, key, "b", time.Second)
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	bAt := make(chan time.Time, 1)
	go func() {
		if _, err := b.Campaign(ctx); err == nil {
			bAt <- time.Now()
		}
	}()
	electiontest.WaitFor(t, 5*time.Second, "b to queue", func() bool { return srv.Entries(key) == 2 })
	clock.set(t0.Add(ttl - margin)) // a's deadline, by a's clock; its timer fires in real time, later
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	retired := time.Now()
	_, _ = a.Campaign(cctx)
	cancel()
	<-a.Done()
	if !errors.Is(a.Err(), tenure.ErrLeaseExpired) {
		t.Errorf("a's term ended with %v, want ErrLeaseExpired", a.Err())
	}
	select {
	case at := <-bAt:
		t.Logf("b elected %v after a's campaign found its deadline passed (margin %v)", at.Sub(retired), margin)
		if at.Sub(retired) < margin/2 {
			t.Fatalf("b elected %v after a's deadline: no DeadlineMargin for a's work to stop", at.Sub(retired))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b not elected within 5 s")
	}
}

// fedBackend is a memory client whose Observe reports what the test sends.
type fedBackend struct {
	*electiontest.Client
	leaders chan tenure.Leader
}

func (f fedBackend) Observe(ctx context.Context, key string, emit func(tenure.Leader)) error {
	for {
		select {
		case l := <-f.leaders:
			l.Key = key
			emit(l)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fedElector returns an elector with metrics on a fedBackend.
func fedElector(t *testing.T) (fedBackend, *election.Elector, *prometheus.Registry, context.Context) {
	t.Helper()
	srv, key, ctx := setup(t)
	m, reg := newMetrics(t)
	f := fedBackend{srv.Client(), make(chan tenure.Leader)}
	w, err := election.New(f, election.Config{Key: key, Identity: "w", TTL: time.Second}, election.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return f, w, reg, ctx
}

func leaderOf(token uint64, id string) tenure.Leader {
	return tenure.Leader{Term: tenure.Term{Token: token, Identity: id, Backend: "test"}}
}

// feed sends ls to the observation and waits until the observer's channel
// shows the last of them.
func feed(t *testing.T, f fedBackend, o *observer, ls ...tenure.Leader) {
	t.Helper()
	for _, l := range ls {
		f.leaders <- l
	}
	last := ls[len(ls)-1]
	electiontest.WaitFor(t, 5*time.Second, "the observer to catch up", func() bool { return o.sees(last.Vacant, last.Term.Token) })
}

// TestFailover_TokensThatGoBackAreEachCounted: on Redis a leader's token
// can be lower than an earlier one's (advisory terms); each failover is
// still one sample. Deduplicating by "highest token seen" dropped them.
func TestFailover_TokensThatGoBackAreEachCounted(t *testing.T) {
	f, w, reg, ctx := fedElector(t)
	octx, cancel := context.WithCancel(ctx)
	o := observe(octx, w)
	vacant := tenure.Leader{Vacant: true}
	feed(t, f, o, leaderOf(100, "a"), vacant, leaderOf(1, "b"), vacant, leaderOf(2, "a"), vacant, leaderOf(101, "b"))
	cancel()
	<-o.done
	if n := failovers(t, reg); n != 3 {
		t.Fatalf("three failovers, the tokens going back: %d samples, want 3", n)
	}
}

// TestFailover_NotTimedAcrossObservations: a vacancy whose start one
// Observe saw and whose end it did not (it ended first) is not recorded
// by a later Observe that only sees a leader. A vacancy timed on the
// elector was closed by the next observer's first value, with the time
// that passed between the two observations.
func TestFailover_NotTimedAcrossObservations(t *testing.T) {
	f, w, reg, ctx := fedElector(t)
	first, stopFirst := context.WithCancel(ctx)
	o := observe(first, w)
	feed(t, f, o, leaderOf(5, "a"), tenure.Leader{Vacant: true})
	stopFirst()
	<-o.done
	time.Sleep(200 * time.Millisecond)
	second, stopSecond := context.WithCancel(ctx)
	o = observe(second, w)
	feed(t, f, o, leaderOf(6, "b"))
	stopSecond()
	<-o.done
	if n := failovers(t, reg); n != 0 {
		t.Fatalf("no observer saw a whole vacancy: %d samples, want 0", n)
	}
}

// TestStatus_CampaigningWhileTheSessionCannotOpen: Run that cannot open
// its session (the backend does not answer) is campaigning, not idle, as
// /status reports it. It said "idle" before: only a queued entry counted.
func TestStatus_CampaigningWhileTheSessionCannotOpen(t *testing.T) {
	srv, key, ctx := setup(t)
	e, c := newElector(t, srv, key, "a", 3*time.Second)
	heal := c.CutOff()
	defer heal()
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- e.Run(runCtx, tenure.Callbacks{}) }()
	defer func() { stop(); <-runDone }()
	electiontest.WaitFor(t, 5*time.Second, "Run to start", func() bool {
		sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		return e.Status(sctx).State != "idle"
	})
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if st := e.Status(sctx); st.State != "campaigning" || st.Position != -1 {
		t.Errorf("Run whose session cannot open: state %q, position %d; want campaigning, -1", st.State, st.Position)
	}
}

// TestHandler_NilGathererServesNoMetrics: a nil *prometheus.Registry
// given as the gatherer leaves /metrics out, as a nil gatherer does,
// instead of panicking on every scrape.
func TestHandler_NilGathererServesNoMetrics(t *testing.T) {
	srv, key, _ := setup(t)
	e, _ := newElector(t, srv, key, "a", 3*time.Second)
	var none *prometheus.Registry
	h := e.Handler(none)
	for path, want := range map[string]int{"/metrics": http.StatusNotFound, "/healthz": http.StatusOK} {
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("GET %s panicked: %v", path, p)
				}
			}()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		}()
		if rec.Code != want {
			t.Errorf("GET %s: %d, want %d", path, rec.Code, want)
		}
	}
}

// seriesOf returns the values of reg's series with label key=k, by metric
// name (counters and gauges; histograms by their sample count).
func seriesOf(t *testing.T, reg *prometheus.Registry, k string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() != "key" || l.GetValue() != k {
					continue
				}
				switch {
				case s.GetCounter() != nil:
					out[mf.GetName()] += s.GetCounter().GetValue()
				case s.GetGauge() != nil:
					out[mf.GetName()] += s.GetGauge().GetValue()
				case s.GetHistogram() != nil:
					out[mf.GetName()] += float64(s.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return out
}

// stallClock is time.Now, except that the second call made directly from
// Mutex.Lock (the one that measures the wait, after the campaign has
// returned) blocks until release is closed, once armed.
type stallClock struct {
	mu      sync.Mutex
	calls   int
	stalled chan struct{} // closed when the call blocks
	release chan struct{}
}

func (c *stallClock) Now() time.Time {
	pcs := make([]uintptr, 1)
	if runtime.Callers(2, pcs) == 1 {
		if f, _ := runtime.CallersFrames(pcs).Next(); strings.HasSuffix(f.Function, "election.(*Mutex).Lock") {
			c.mu.Lock()
			c.calls++
			n := c.calls
			c.mu.Unlock()
			if n == 2 {
				close(c.stalled)
				<-c.release
			}
		}
	}
	return time.Now()
}

// TestMetrics_ALockThatReturnsAfterCloseStartsNoSeries: a Lock whose
// campaign returned just before the Mutex was closed (and its series
// collected one last time, then dropped) does not start the key's series
// again when it records its wait: nothing would ever drop them.
func TestMetrics_ALockThatReturnsAfterCloseStartsNoSeries(t *testing.T) {
	srv, key, ctx := setup(t)
	m, reg := newMetrics(t)
	clk := &stallClock{stalled: make(chan struct{}), release: make(chan struct{})}
	mu, err := election.NewMutex(srv.Client(), election.Config{Key: key, Identity: "a", TTL: 3 * time.Second},
		election.WithMetrics(m), election.WithClock(clk))
	if err != nil {
		t.Fatal(err)
	}
	locked := make(chan error, 1)
	go func() { _, err := mu.Lock(ctx); locked <- err }()
	select {
	case <-clk.stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not reach its wait measurement")
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := mu.Close(cctx); err != nil {
		close(clk.release)
		t.Fatalf("Close: %v", err)
	}
	seriesOf(t, reg, key) // the final counts
	if n := len(seriesOf(t, reg, key)); n != 0 {
		close(clk.release)
		t.Fatalf("%d series left after Close and two scrapes", n)
	}
	close(clk.release)
	if err := <-locked; err != nil {
		t.Logf("Lock returned %v", err)
	}
	if got := seriesOf(t, reg, key); len(got) != 0 {
		t.Fatalf("series of the closed Mutex's key started again by the Lock that returned after Close: %v", got)
	}
}

// TestHandler_EmptyGatherersServesMetrics: a nil prometheus.Gatherers is
// a working Gatherer (it gathers nothing): /metrics is served, empty.
func TestHandler_EmptyGatherersServesMetrics(t *testing.T) {
	srv, key, _ := setup(t)
	e, _ := newElector(t, srv, key, "a", 3*time.Second)
	var gs prometheus.Gatherers // var gs ...; if enabled { gs = append(gs, reg) }
	rec := httptest.NewRecorder()
	e.Handler(gs).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics with an empty Gatherers: %d, want 200", rec.Code)
	}
}
