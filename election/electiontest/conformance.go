package electiontest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Harness adapts a backend to the conformance suite. NewBackend, TTL,
// Crash, CutOff and ExpireSession are required; the fields documented as
// optional may be left zero. The suite calls its functions one at a time,
// from the test's goroutine, while other goroutines use the backends they
// act on.
type Harness struct {
	// NewBackend returns a new client of the backend under test, as
	// independent of the others as a separate process's would be. The suite
	// never closes it: NewBackend must register its closing with t.Cleanup.
	NewBackend func(t testing.TB) election.Backend
	// TTL is the session TTL the suite uses; the backend must honour it.
	TTL time.Duration
	// Crash makes b behave like a killed process: no more renewals, nothing
	// released.
	Crash func(t testing.TB, b election.Backend)
	// CutOff blackholes b from the server until heal is called.
	CutOff func(t testing.TB, b election.Backend) (heal func())
	// Cut closes b's open connections to the server, as a server that
	// drops its clients would; b may connect again at once. Optional: the
	// case that needs it is skipped without it.
	Cut func(t testing.TB, b election.Backend)
	// ExpireSession ends, on the server, the session of the candidate
	// identity queued on key.
	ExpireSession func(t testing.TB, key, identity string)
	// DeleteEntry deletes term's entry on the server (term.Entry; on Redis
	// the key), as an operator "unsticking" a lock would. Optional: the
	// case that needs it is skipped without it.
	DeleteEntry func(t testing.TB, term tenure.Term)
	// FailoverSlack is how much longer than TTL a crash failover may take:
	// the server's expiry granularity plus one watch delivery and one read.
	// Default: 0, no slack (a crash failover must then finish within TTL).
	FailoverSlack time.Duration
	// Arrivals is how many waiters ArrivalOrder queues in a known order.
	// Default: 6.
	Arrivals int
	// Unordered marks a backend that neither queues waiters in arrival
	// order nor issues fencing tokens (Redis): the arrival-order checks and
	// the Mutex cases (a Mutex refuses such a backend) are skipped; terms
	// must still grow and never overlap.
	Unordered bool
}

var keySeq atomic.Int64

// Key returns a key unique to the test: an absolute path, valid on every
// backend.
func Key(t testing.TB) string {
	name := strings.Map(func(r rune) rune {
		if r == '/' || r < 0x20 || r > 0x7e {
			return '_'
		}
		return r
	}, t.Name())
	return fmt.Sprintf("/tenure-test/%s-%d", name, keySeq.Add(1))
}

// NewElector returns an elector on a new client of h's backend, closed at
// the end of the test.
func (h Harness) NewElector(t testing.TB, key, identity string, mod ...func(*election.Config)) (*election.Elector, election.Backend) {
	t.Helper()
	b := h.NewBackend(t)
	cfg := election.Config{Key: key, Identity: identity, TTL: h.TTL}
	for _, f := range mod {
		f(&cfg)
	}
	e, err := election.New(b, cfg)
	if err != nil {
		t.Fatalf("election.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*h.TTL)
		defer cancel()
		_ = e.Close(ctx)
	})
	return e, b
}

// Run runs every conformance case against h's backend.
func Run(t *testing.T, h Harness) {
	cases := []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"CampaignResignLeader", testCampaignResignLeader},
		{"NeverTwoLeadersTermsGrowFIFO", testNeverTwoLeaders},
		{"ArrivalOrder", testArrivalOrder},
		{"RapidRequeueNeverStalls", testRapidRequeue},
		{"CancelWhileWaitingRemovesEntry", testCancelWhileWaiting},
		{"SessionExpiryWhileWaiting", testSessionExpiryWhileWaiting},
		{"TryCampaign", testTryCampaign},
		{"FailedResignNeverReusesTerm", testFailedResignNewTerm},
		{"TermEndedAtDeadlineNeverReusesToken", testDeadlineNewToken},
		{"DeletedEntryDemotesThenCampaignsAgain", testDeletedEntry},
		{"CrashFailoverWithinTTL", testCrashFailover},
		{"CutOffLeaderDemotesBeforeSuccessor", testCutOffDemotesFirst},
		{"RunStopsWorkThenResigns", testRunStops},
		{"PanicIsResignation", testPanicIsResignation},
		{"HardStopHoldsLeadership", testHardStop},
		{"ObserveSeesVacancyAndLeaders", testObserve},
		{"CloseReleases", testCloseReleases},
		{"SessionCloseEndsItsWaits", testSessionCloseEndsWaits},
		{"CloseDuringRunWaitsForWork", testCloseDuringRun},
		{"CloseEndsRunCutOffBeforeItsSession", testCloseDuringOutage},
		{"CutOffHealedAtDeadlineNoOverlap", testHealAtDeadline},
		{"TwoRunsNeverRunWorkTwice", testTwoRuns},
		{"BriefCutOffKeepsLeadership", testBriefCutOff},
		{"NestedKeysAreIndependent", testNestedKeys},
		{"ConnectionCutMidCampaign", testCutMidCampaign},
		{"MutexArrivalOrder", testMutexArrivalOrder},
		{"MutexTryLockUnderContention", testMutexTryLock},
		{"MutexLossCancelsContextBeforeNextHolder", testMutexLoss},
		{"MutexGoroutinesOfOneProcessSerialize", testMutexGoroutines},
		{"MutexExtraUnlockAdmitsNobody", testMutexExtraUnlock},
		{"MutexCloseWakesLocalWaiters", testMutexCloseWakes},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			switch {
			case h.Unordered && (c.name == "ArrivalOrder" || strings.HasPrefix(c.name, "Mutex")):
				t.Skip("the backend does not queue in arrival order; a Mutex refuses it")
			case h.ExpireSession == nil && c.name == "SessionExpiryWhileWaiting":
				t.Skip("the backend has no server-side sessions to expire")
			case h.Cut == nil && c.name == "ConnectionCutMidCampaign":
				t.Skip("the harness cannot cut connections")
			case h.DeleteEntry == nil && c.name == "DeletedEntryDemotesThenCampaignsAgain":
				t.Skip("the harness cannot delete entries")
			}
			c.f(t, h)
		})
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond every 5 ms until it holds, and fails t (Fatalf,
// naming what) when d passes first. Call it from the test's goroutine. For
// backends' own tests.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func position(ctx context.Context, e *election.Elector) int {
	n, err := e.Position(ctx)
	if err != nil {
		return -1
	}
	return n
}

func mustVacant(t testing.TB, h Harness, key string) {
	t.Helper()
	b := h.NewBackend(t)
	WaitFor(t, 2*h.TTL, "key "+key+" to be vacant", func() bool {
		l, err := b.Leader(ctxT(t, h.TTL), key)
		return err == nil && l.Vacant
	})
}

func testCampaignResignLeader(t *testing.T, h Harness) {
	key := Key(t)
	e, _ := h.NewElector(t, key, "a")
	ctx := ctxT(t, 5*h.TTL)
	if e.IsLeader() {
		t.Fatal("IsLeader before Campaign")
	}
	if err := e.Err(); !errors.Is(err, tenure.ErrNotLeader) {
		t.Fatalf("Err before Campaign = %v, want ErrNotLeader", err)
	}
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	if term.Token == 0 || term.Key != key || term.Identity != "a" || term.Backend == "" {
		t.Fatalf("term = %+v", term)
	}
	if !e.IsLeader() {
		t.Fatal("not IsLeader after Campaign")
	}
	again, err := e.Campaign(ctx)
	if err != nil || again.Token != term.Token {
		t.Fatalf("second Campaign = %v, %v; want the same term", again, err)
	}
	l, err := e.Leader(ctx)
	if err != nil {
		t.Fatalf("Leader: %v", err)
	}
	if l.Vacant || l.Term.Token != term.Token || l.Term.Identity != "a" {
		t.Fatalf("Leader = %+v, want token %d identity a", l, term.Token)
	}
	select {
	case <-e.Done():
		t.Fatal("Done closed while leading")
	default:
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	select {
	case <-e.Done():
	default:
		t.Fatal("Done not closed after Resign")
	}
	if !errors.Is(e.Err(), tenure.ErrResigned) {
		t.Fatalf("Err after Resign = %v", e.Err())
	}
	if e.IsLeader() {
		t.Fatal("IsLeader after Resign")
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatalf("second Resign: %v", err)
	}
	if l, err := e.Leader(ctx); err != nil || !l.Vacant {
		t.Fatalf("Leader after Resign = %+v, %v; want vacant", l, err)
	}
	next, err := e.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign after Resign: %v", err)
	}
	if next.Token <= term.Token {
		t.Fatalf("term after re-election %d not above %d", next.Token, term.Token)
	}
}

// election records one OnElected run.
type electionRec struct {
	identity string
	token    uint64
}

func testNeverTwoLeaders(t *testing.T, h Harness) {
	key := Key(t)
	const n, want = 4, 24
	var (
		active  atomic.Int32
		mu      sync.Mutex
		history []electionRec
		overlap atomic.Int32
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		id := fmt.Sprintf("c%d", i)
		e, _ := h.NewElector(t, key, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.Run(ctx, tenure.Callbacks{OnElected: func(lctx context.Context, term tenure.Term) {
				if active.Add(1) != 1 {
					overlap.Add(1)
				}
				mu.Lock()
				history = append(history, electionRec{id, term.Token})
				done := len(history) >= want
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				active.Add(-1)
				if done {
					cancel()
				}
			}})
		}()
	}
	WaitFor(t, 30*h.TTL, fmt.Sprintf("%d elections", want), func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(history) >= want
	})
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want ErrCanceled joined with context.Canceled", err)
		}
	}
	if o := overlap.Load(); o != 0 {
		t.Fatalf("%d elections overlapped another leader", o)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(history); i++ {
		if history[i].token <= history[i-1].token {
			t.Fatalf("term %d of %s follows term %d of %s: terms must grow", history[i].token, history[i].identity, history[i-1].token, history[i-1].identity)
		}
	}
	// FIFO: each leader re-queues behind the others, so after the first
	// round every window of n consecutive elections holds n distinct
	// candidates.
	for i := n; !h.Unordered && i+n <= len(history); i++ {
		seen := map[string]bool{}
		for _, r := range history[i : i+n] {
			seen[r.identity] = true
		}
		if len(seen) != n {
			t.Fatalf("elections %d..%d = %v: not round-robin, so not FIFO", i, i+n-1, history[i:i+n])
		}
	}
	mustVacant(t, h, key)
}

func testArrivalOrder(t *testing.T, h Harness) {
	key := Key(t)
	arrivalOrder(t, h, 20*h.TTL, func(id string) candidate {
		e, _ := h.NewElector(t, key, id)
		return candidate{
			acquire:  func(ctx context.Context) error { _, err := e.Campaign(ctx); return err },
			release:  e.Resign,
			position: e.Position,
		}
	})
}

// candidate is an Elector or a Mutex, as arrivalOrder drives it.
type candidate struct {
	acquire, release func(context.Context) error
	position         func(context.Context) (int, error)
}

// arrivalOrder queues h.Arrivals candidates (default 6), one at a time,
// behind a holder, and checks that they acquire in arrival order, all
// within limit.
func arrivalOrder(t *testing.T, h Harness, limit time.Duration, newCandidate func(id string) candidate) {
	ctx := ctxT(t, limit)
	holder := newCandidate("holder")
	if err := holder.acquire(ctx); err != nil {
		t.Fatalf("holder: %v", err)
	}
	n := h.Arrivals
	if n == 0 {
		n = 6
	}
	order := make(chan string, n)
	var wg sync.WaitGroup
	for i := range n {
		id := fmt.Sprintf("w%d", i)
		c := newCandidate(id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.acquire(ctx); err != nil {
				t.Errorf("%s: acquire: %v", id, err)
				return
			}
			order <- id
			if err := c.release(ctx); err != nil {
				t.Errorf("%s: release: %v", id, err)
			}
		}()
		// Wait until this waiter is queued (behind the holder and the
		// earlier waiters) before the next one arrives.
		WaitFor(t, 5*h.TTL, id+" to queue", func() bool {
			p, err := c.position(ctx)
			return err == nil && p == i+1
		})
	}
	if err := holder.release(ctx); err != nil {
		t.Fatalf("holder: %v", err)
	}
	wg.Wait()
	close(order)
	i := 0
	for id := range order {
		if want := fmt.Sprintf("w%d", i); id != want {
			t.Fatalf("turn %d went to %s, want %s (arrival order)", i, id, want)
		}
		i++
	}
	if i != n {
		t.Fatalf("%d of %d waiters got their turn", i, n)
	}
}

func testCancelWhileWaiting(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	holder, _ := h.NewElector(t, key, "holder")
	if _, err := holder.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	waiter, _ := h.NewElector(t, key, "waiter")
	wctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() { _, err := waiter.Campaign(wctx); res <- err }()
	WaitFor(t, 5*h.TTL, "waiter to queue", func() bool { return position(ctx, waiter) == 1 })
	cancel()
	err := <-res
	if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Campaign = %v, want ErrCanceled joined with context.Canceled", err)
	}
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// The waiter's session still lives: only a removed entry leaves the key vacant.
	l, err := holder.Leader(ctx)
	if err != nil || !l.Vacant {
		t.Fatalf("after the holder resigned, Leader = %+v, %v; want vacant (the cancelled entry must be gone)", l, err)
	}
}

func testSessionExpiryWhileWaiting(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	holder, _ := h.NewElector(t, key, "holder")
	if _, err := holder.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	waiter, _ := h.NewElector(t, key, "waiter")
	res := make(chan error, 1)
	go func() { _, err := waiter.Campaign(ctx); res <- err }()
	WaitFor(t, 5*h.TTL, "waiter to queue", func() bool { return position(ctx, waiter) == 1 })
	h.ExpireSession(t, key, "waiter")
	ended := time.Now()
	select {
	case err := <-res:
		took := time.Since(ended)
		if !errors.Is(err, tenure.ErrSessionExpired) {
			t.Fatalf("Campaign after session expiry = %v, want ErrSessionExpired", err)
		}
		t.Logf("waiting Campaign returned ErrSessionExpired %v after the session ended", took)
	case <-time.After(h.FailoverSlack):
		// "At once" (README): the session's end is an event the backend
		// delivers, not something found at the next renewal.
		t.Fatalf("waiting Campaign did not return within FailoverSlack %v of its session's expiry", h.FailoverSlack)
	}
	if !holder.IsLeader() {
		t.Fatal("holder lost leadership when a waiter's session expired")
	}
	// A new campaign opens a new session and queues again.
	go func() { _, err := waiter.Campaign(ctx); res <- err }()
	WaitFor(t, 5*h.TTL, "waiter to queue again", func() bool { return position(ctx, waiter) == 1 })
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatalf("Campaign on a new session: %v", err)
	}
}

func testTryCampaign(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	a, _ := h.NewElector(t, key, "a")
	b, _ := h.NewElector(t, key, "b")
	ta, err := a.TryCampaign(ctx)
	if err != nil {
		t.Fatalf("TryCampaign on a vacant key: %v", err)
	}
	if _, err := b.TryCampaign(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Fatalf("TryCampaign on a held key = %v, want ErrLocked", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := a.Leader(ctx); err != nil || !l.Vacant {
		t.Fatalf("Leader = %+v, %v; want vacant (the refused entry must be gone)", l, err)
	}
	tb, err := b.TryCampaign(ctx)
	if err != nil {
		t.Fatalf("TryCampaign after release: %v", err)
	}
	if tb.Token <= ta.Token {
		t.Fatalf("term %d not above %d", tb.Token, ta.Token)
	}
}

func testCrashFailover(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	a, ba := h.NewElector(t, key, "a")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := h.NewElector(t, key, "b")
	res := make(chan tenure.Term, 1)
	go func() {
		tb, err := b.Campaign(ctx)
		if err != nil {
			t.Errorf("Campaign: %v", err)
		}
		res <- tb
	}()
	WaitFor(t, 5*h.TTL, "b to queue", func() bool { return position(ctx, b) == 1 })
	crashed := time.Now()
	h.Crash(t, ba)
	bound := h.TTL + h.FailoverSlack
	select {
	case tb := <-res:
		took := time.Since(crashed)
		t.Logf("crash failover took %v (TTL %v, bound %v)", took, h.TTL, bound)
		if tb.Token <= ta.Token {
			t.Fatalf("successor's term %d not above %d", tb.Token, ta.Token)
		}
	case <-time.After(bound):
		t.Fatalf("no successor within TTL + slack = %v of the crash", bound)
	}
}

func testCutOffDemotesFirst(t *testing.T, h Harness) {
	key := Key(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type event struct {
		who    string
		what   string
		at     time.Time
		reason error
	}
	events := make(chan event, 16)
	run := func(e *election.Elector, id string) chan error {
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, tenure.Callbacks{
				OnElected: func(lctx context.Context, term tenure.Term) {
					events <- event{who: id, what: "elected", at: time.Now()}
					<-lctx.Done()
					events <- event{who: id, what: "stopped", at: time.Now()}
				},
				OnDemoted: func(term tenure.Term, reason error) {
					events <- event{who: id, what: "demoted", at: time.Now(), reason: reason}
				},
			})
		}()
		return done
	}
	a, ba := h.NewElector(t, key, "a")
	doneA := run(a, "a")
	if ev := <-events; ev.who != "a" || ev.what != "elected" {
		t.Fatalf("first event %+v, want a elected", ev)
	}
	b, _ := h.NewElector(t, key, "b")
	doneB := run(b, "b")
	WaitFor(t, 5*h.TTL, "b to queue", func() bool { return position(ctx, b) == 1 })
	cut := time.Now()
	heal := h.CutOff(t, ba)
	var stoppedA, demotedA, electedB time.Time
	timeout := time.After(3*h.TTL + h.FailoverSlack)
	for stoppedA.IsZero() || demotedA.IsZero() || electedB.IsZero() {
		select {
		case ev := <-events:
			switch {
			case ev.who == "a" && ev.what == "stopped":
				stoppedA = ev.at
			case ev.who == "a" && ev.what == "demoted" && demotedA.IsZero():
				demotedA = ev.at
				if !errors.Is(ev.reason, tenure.ErrLeaseExpired) {
					t.Errorf("a demoted with %v, want ErrLeaseExpired", ev.reason)
				}
			case ev.who == "b" && ev.what == "elected":
				electedB = ev.at
			}
		case <-timeout:
			t.Fatalf("after cutting a off: a stopped at %v, demoted at %v, b elected at %v", stoppedA, demotedA, electedB)
		}
	}
	t.Logf("a cut off; a's work cancelled after %v, b elected after %v (%v later)",
		stoppedA.Sub(cut), electedB.Sub(cut), electedB.Sub(stoppedA))
	if !stoppedA.Before(electedB) {
		t.Fatalf("b was elected %v before the cut-off leader a stopped", stoppedA.Sub(electedB))
	}
	// The deadline falls at least DeadlineMargin before the server's
	// expiry; half of it, for the scheduling of two goroutines.
	if gap, margin := electedB.Sub(stoppedA), a.Config().DeadlineMargin; gap < margin/2 {
		t.Errorf("a stopped only %v before b was elected; the deadline should fall DeadlineMargin (%v) before the server's expiry", gap, margin)
	}
	heal()
	cancel()
	for _, d := range []chan error{doneA, doneB} {
		if err := <-d; !errors.Is(err, tenure.ErrCanceled) {
			t.Errorf("Run = %v, want ErrCanceled", err)
		}
	}
}

func testRunStops(t *testing.T, h Harness) {
	key := Key(t)
	e, _ := h.NewElector(t, key, "a")
	ctx, cancel := context.WithCancel(context.Background())
	elected := make(chan tenure.Term, 1)
	var stopped, demoted atomic.Bool
	var reason error
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				elected <- term
				<-lctx.Done()
				stopped.Store(true)
			},
			OnDemoted: func(term tenure.Term, r error) {
				if !stopped.Load() {
					t.Error("OnDemoted ran before OnElected returned")
				}
				reason = r
				demoted.Store(true)
			},
		})
	}()
	select {
	case <-elected:
	case <-time.After(5 * h.TTL):
		t.Fatal("not elected")
	}
	cancel()
	err := <-done
	if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want ErrCanceled joined with context.Canceled", err)
	}
	if !stopped.Load() || !demoted.Load() {
		t.Fatalf("stopped=%v demoted=%v, want both", stopped.Load(), demoted.Load())
	}
	if !errors.Is(reason, tenure.ErrResigned) {
		t.Fatalf("demotion reason %v, want ErrResigned", reason)
	}
	if l, err := e.Leader(ctxT(t, h.TTL)); err != nil || !l.Vacant {
		t.Fatalf("Leader after Run returned = %+v, %v; want vacant", l, err)
	}
}

func testPanicIsResignation(t *testing.T, h Harness) {
	key := Key(t)
	e, _ := h.NewElector(t, key, "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	reasons := make(chan error, 4)
	done := make(chan error, 1)
	go func() {
		done <- e.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				if calls.Add(1) == 1 {
					panic("boom")
				}
				cancel()
			},
			OnDemoted: func(term tenure.Term, r error) { reasons <- r },
		})
	}()
	if err := <-done; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("Run = %v", err)
	}
	if first := <-reasons; !errors.Is(first, tenure.ErrCallbackPanic) || !errors.Is(first, tenure.ErrResigned) {
		t.Fatalf("reason after a panic = %v, want ErrCallbackPanic and ErrResigned", first)
	}
	if calls.Load() != 2 {
		t.Fatalf("OnElected ran %d times, want 2 (re-elected after the panic)", calls.Load())
	}
}

func testHardStop(t *testing.T, h Harness) {
	key := Key(t)
	a, _ := h.NewElector(t, key, "a")
	stopT := a.Config().StopTimeout
	ctx, cancel := context.WithCancel(context.Background())
	elected := make(chan struct{})
	hard := make(chan time.Time, 1)
	var workReturned atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- a.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				close(elected)
				<-lctx.Done()
				time.Sleep(2 * stopT) // ignores its context
				workReturned.Store(time.Now().UnixNano())
			},
			OnHardStop: func(tenure.Term) { hard <- time.Now() },
		})
	}()
	<-elected
	b, _ := h.NewElector(t, key, "b")
	bres := make(chan time.Time, 1)
	go func() {
		if _, err := b.Campaign(ctxT(t, 10*h.TTL)); err != nil {
			t.Errorf("b: %v", err)
		}
		bres <- time.Now()
	}()
	WaitFor(t, 5*h.TTL, "b to queue", func() bool { return position(context.Background(), b) == 1 })
	cancelled := time.Now()
	cancel()
	select {
	case at := <-hard:
		if d := at.Sub(cancelled); d < stopT {
			t.Fatalf("OnHardStop after %v, before StopTimeout %v", d, stopT)
		}
	case <-time.After(5 * h.TTL):
		t.Fatal("OnHardStop not called")
	}
	<-done
	bAt := <-bres
	// workReturned is 0 while the work still runs: b elected then is the
	// very overlap this case rules out.
	if w := workReturned.Load(); w == 0 || !bAt.After(time.Unix(0, w)) {
		t.Fatalf("b elected at %v, before a's work returned (at %v; 0: still running)", bAt, time.Unix(0, w))
	}
}

func testObserve(t *testing.T, h Harness) {
	key := Key(t)
	obs, _ := h.NewElector(t, key, "observer")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := obs.Observe(ctx)
	next := func(what string, ok func(tenure.Leader) bool) {
		t.Helper()
		timeout := time.After(5 * h.TTL)
		for {
			select {
			case l := <-ch:
				if ok(l) {
					return
				}
			case <-timeout:
				t.Fatalf("Observe did not report %s", what)
			}
		}
	}
	next("vacancy", func(l tenure.Leader) bool { return l.Vacant })
	a, _ := h.NewElector(t, key, "a")
	ta, err := a.Campaign(ctxT(t, 5*h.TTL))
	if err != nil {
		t.Fatal(err)
	}
	next("a", func(l tenure.Leader) bool { return !l.Vacant && l.Term.Token == ta.Token && l.Term.Identity == "a" })
	if err := a.Resign(ctxT(t, h.TTL)); err != nil {
		t.Fatal(err)
	}
	next("vacancy after resign", func(l tenure.Leader) bool { return l.Vacant })
	cancel()
	closed := time.After(5 * h.TTL)
	for { // the channel closes when ctx ends
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-closed:
			t.Fatalf("Observe's channel still open %v after its ctx ended", 5*h.TTL)
		}
	}
}

func testCloseReleases(t *testing.T, h Harness) {
	key := Key(t)
	e, _ := h.NewElector(t, key, "a")
	ctx := ctxT(t, 5*h.TTL)
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.Campaign(ctx); !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("Campaign after Close = %v, want ErrClosed", err)
	}
	mustVacant(t, h, key)
}

// testRapidRequeue: two candidates hand the key back and forth, each
// re-queueing the moment it resigns. A waiter must never mistake its
// predecessor's new entry (same session, often the same backend name) for
// the one it waits for: no handoff may stall.
func testRapidRequeue(t *testing.T, h Harness) {
	key := Key(t)
	const handoffs = 300
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var count atomic.Int64
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	for i := range 2 {
		e, _ := h.NewElector(t, key, fmt.Sprintf("c%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := e.Campaign(ctx); err != nil {
					if ctx.Err() == nil {
						t.Errorf("Campaign: %v", err)
					}
					return
				}
				last.Store(time.Now().UnixNano())
				if count.Add(1) >= handoffs {
					cancel()
				}
				if err := e.Resign(context.Background()); err != nil {
					t.Errorf("Resign: %v", err)
					return
				}
			}
		}()
	}
	for ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
		if stall := time.Since(time.Unix(0, last.Load())); stall > h.TTL {
			cancel()
			wg.Wait()
			t.Fatalf("no handoff for %v after %d handoffs: a waiter is stuck", stall, count.Load())
		}
	}
	wg.Wait()
}

// testFailedResignNewTerm: when a resignation fails (the link is down), the
// entry stays; the next campaign must still get a new, larger term, never
// the old term's token again.
// testNewTermAfterCutOff: a leader cut off from the server loses its term
// by end (a failed Resign, its lease deadline), its entry not deleted.
// Healed at once, before the server can expire it, it campaigns again: the
// old entry may still stand (ZooKeeper: one server session per
// connection, which outlives the elector's session), yet the new term must
// get a larger token, and resign cleanly.
func testNewTermAfterCutOff(t *testing.T, h Harness, how string, end func(e *election.Elector)) {
	key := Key(t)
	e, b := h.NewElector(t, key, "a")
	first, err := e.Campaign(ctxT(t, 5*h.TTL))
	if err != nil {
		t.Fatal(err)
	}
	heal := h.CutOff(t, b)
	end(e)
	heal()
	second, err := e.Campaign(ctxT(t, 5*h.TTL))
	if err != nil {
		t.Fatalf("Campaign after %s: %v", how, err)
	}
	if second.Token <= first.Token {
		t.Fatalf("new term %d after term %d, which ended by %s: a term's token was reused", second.Token, first.Token, how)
	}
	if err := e.Resign(ctxT(t, h.TTL)); err != nil {
		t.Fatal(err)
	}
	mustVacant(t, h, key)
}

func testFailedResignNewTerm(t *testing.T, h Harness) {
	testNewTermAfterCutOff(t, h, "a failed Resign", func(e *election.Elector) {
		rctx, cancel := context.WithTimeout(context.Background(), h.TTL/10)
		err := e.Resign(rctx)
		cancel()
		if err == nil {
			t.Fatal("Resign succeeded while cut off")
		}
		if e.IsLeader() {
			t.Fatal("still IsLeader after a failed Resign")
		}
	})
}

func testDeadlineNewToken(t *testing.T, h Harness) {
	testNewTermAfterCutOff(t, h, "its lease deadline", func(e *election.Elector) {
		WaitFor(t, 2*h.TTL, "the term to end at its deadline", func() bool { return !e.IsLeader() })
	})
}

// slowStopper runs a with Run; its work, once its context ends, takes
// 80 % of StopTimeout to return. It reports when it was elected and when
// its work returned.
type slowStopper struct {
	elected  chan struct{}
	returned atomic.Int64
	reason   chan error
	done     chan error
}

func runSlowStopper(ctx context.Context, a *election.Elector) *slowStopper {
	s := &slowStopper{elected: make(chan struct{}), reason: make(chan error, 4), done: make(chan error, 1)}
	stopT := a.Config().StopTimeout
	var once sync.Once
	go func() {
		s.done <- a.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				once.Do(func() { close(s.elected) })
				<-lctx.Done()
				time.Sleep(stopT * 8 / 10)
				s.returned.CompareAndSwap(0, time.Now().UnixNano())
			},
			OnDemoted: func(_ tenure.Term, r error) { s.reason <- r },
		})
	}()
	return s
}

// campaignAt starts b's campaign and returns when it was elected.
func campaignAt(t *testing.T, h Harness, b *election.Elector) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() {
		if _, err := b.Campaign(ctxT(t, 10*h.TTL)); err != nil {
			t.Errorf("Campaign: %v", err)
			return
		}
		at <- time.Now()
	}()
	WaitFor(t, 5*h.TTL, "the waiter to queue", func() bool { return position(context.Background(), b) == 1 })
	return at
}

// testCloseDuringRun: Close from another goroutine while Run leads ends the
// term with ErrClosed and releases the key only after OnElected returned.
func testCloseDuringRun(t *testing.T, h Harness) {
	key := Key(t)
	a, _ := h.NewElector(t, key, "a")
	s := runSlowStopper(context.Background(), a)
	<-s.elected
	b, _ := h.NewElector(t, key, "b")
	bAt := campaignAt(t, h, b)
	if err := a.Close(ctxT(t, 2*h.TTL)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-s.done; !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
	if r := <-s.reason; !errors.Is(r, tenure.ErrClosed) {
		t.Fatalf("demotion reason %v, want ErrClosed", r)
	}
	elected := <-bAt
	if ret := time.Unix(0, s.returned.Load()); s.returned.Load() == 0 || !elected.After(ret) {
		t.Fatalf("b elected at %v, before a's work returned (%v)", elected, ret)
	}
}

// testCloseDuringOutage: Close ends a Run whose elector was cut off from
// the server before it had a session. Run's ctx never ends here, and a
// client that waits for a connection until its ctx ends (etcd's does)
// must not hold Run, opening a session, past Close.
func testCloseDuringOutage(t *testing.T, h Harness) {
	a, ba := h.NewElector(t, Key(t), "a")
	heal := h.CutOff(t, ba)
	defer heal()
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background(), tenure.Callbacks{}) }()
	time.Sleep(h.TTL / 2) // Run is opening its session, or trying again
	if err := a.Close(ctxT(t, 2*h.TTL)); err != nil {
		t.Logf("Close while cut off: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, tenure.ErrClosed) {
			t.Fatalf("Run after Close = %v, want ErrClosed", err)
		}
	case <-time.After(3 * h.TTL):
		t.Fatal("Run still running 3 TTL after Close, cut off from the server")
	}
}

// testHealAtDeadline: a leader cut off until just past its deadline, then
// healed, must not release its entry while its work still runs.
func testHealAtDeadline(t *testing.T, h Harness) {
	key := Key(t)
	a, ba := h.NewElector(t, key, "a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := runSlowStopper(ctx, a)
	<-s.elected
	b, _ := h.NewElector(t, key, "b")
	bAt := campaignAt(t, h, b)
	heal := h.CutOff(t, ba)
	WaitFor(t, 2*h.TTL, "a to be suspended", a.Suspended)
	time.Sleep(time.Until(a.Deadline()) + 10*time.Millisecond)
	heal()
	if h.Unordered {
		// Without a queue, a's next campaign may win the race against b
		// once a's old entry goes: stop a's Run when its work returned.
		WaitFor(t, 3*h.TTL, "a's work to return", func() bool { return s.returned.Load() != 0 })
		cancel()
	}
	var elected time.Time
	select {
	case elected = <-bAt:
	case <-time.After(3 * h.TTL):
		t.Fatal("b not elected after a's lease ran out")
	}
	if ret := time.Unix(0, s.returned.Load()); s.returned.Load() == 0 || !elected.After(ret) {
		t.Fatalf("b elected at %v, before a's work returned (%v)", elected, ret)
	}
	if r := <-s.reason; !errors.Is(r, tenure.ErrLeaseExpired) {
		t.Fatalf("a demoted with %v, want ErrLeaseExpired", r)
	}
	cancel()
	<-s.done
}

// testTwoRuns: a second Run on one elector waits for the first; OnElected
// never runs twice at once.
func testTwoRuns(t *testing.T, h Harness) {
	key := Key(t)
	e, _ := h.NewElector(t, key, "a")
	ctx, cancel := context.WithCancel(context.Background())
	var active, most, calls atomic.Int32
	cb := tenure.Callbacks{OnElected: func(lctx context.Context, _ tenure.Term) {
		n := active.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		calls.Add(1)
		select {
		case <-lctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		active.Add(-1)
	}}
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = e.Run(ctx, cb) }()
	}
	WaitFor(t, 5*h.TTL, "a few terms", func() bool { return calls.Load() >= 4 })
	cancel()
	wg.Wait()
	if m := most.Load(); m != 1 {
		t.Fatalf("%d OnElected ran at once on one elector", m)
	}
}

// testBriefCutOff: a cut-off shorter than the deadline margin allows does not
// demote the leader.
func testBriefCutOff(t *testing.T, h Harness) {
	key := Key(t)
	a, ba := h.NewElector(t, key, "a")
	term, err := a.Campaign(ctxT(t, 5*h.TTL))
	if err != nil {
		t.Fatal(err)
	}
	heal := h.CutOff(t, ba)
	time.Sleep(h.TTL / 10)
	heal()
	time.Sleep(h.TTL)
	select {
	case <-a.Done():
		t.Fatalf("a %v-long cut-off demoted the leader: %v", h.TTL/10, a.Err())
	default:
	}
	if got, ok := a.Term(); !ok || got.Token != term.Token {
		t.Fatalf("after a brief cut-off: Term = %v, %v; want %v", got, ok, term)
	}
}

// testNestedKeys: "k" and "k/sub" are two elections.
func testNestedKeys(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 5*h.TTL)
	a, _ := h.NewElector(t, key, "a")
	b, _ := h.NewElector(t, key+"/sub", "b")
	if _, err := b.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	ta, err := a.TryCampaign(ctx)
	if err != nil {
		t.Fatalf("TryCampaign on %q while %q is held: %v", key, key+"/sub", err)
	}
	if l, err := a.Leader(ctx); err != nil || l.Term.Token != ta.Token || l.Term.Identity != "a" {
		t.Fatalf("Leader(%q) = %+v, %v; want a", key, l, err)
	}
	if l, err := b.Leader(ctx); err != nil || l.Term.Identity != "b" {
		t.Fatalf("Leader(%q) = %+v, %v; want b", key+"/sub", l, err)
	}
}

// testCutMidCampaign: a server that closes a waiter's connections again
// and again while it waits costs the waiter nothing: it is elected, under a
// larger term, when the leader resigns. A campaign cancelled while its
// connections are cut returns ErrCanceled and leaves no entry behind.
func testCutMidCampaign(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 60*time.Second)
	leader, _ := h.NewElector(t, key, "leader")
	lt, err := leader.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiter, wb := h.NewElector(t, key, "waiter")
	got := make(chan error, 1)
	var wt tenure.Term
	go func() {
		var err error
		wt, err = waiter.Campaign(ctx)
		got <- err
	}()
	WaitFor(t, 5*h.TTL, "the waiter to queue", func() bool { return position(ctx, waiter) == 1 })
	for range 5 {
		h.Cut(t, wb)
		time.Sleep(100 * time.Millisecond)
	}
	if err := leader.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil || wt.Token <= lt.Token {
			t.Fatalf("Campaign after five cuts = %v (token %d), want elected above %d", err, wt.Token, lt.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter whose connections were cut was not elected within 20 s of the resign")
	}
	late, lb := h.NewElector(t, key, "cancelled")
	cctx, cancel := context.WithCancel(ctx)
	go func() { _, err := late.Campaign(cctx); got <- err }()
	WaitFor(t, 5*h.TTL, "the second waiter to queue", func() bool { return position(ctx, late) == 1 })
	h.Cut(t, lb)
	cancel()
	select {
	case err := <-got:
		if !errors.Is(err, tenure.ErrCanceled) {
			t.Fatalf("Campaign cancelled during a cut = %v, want ErrCanceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the cancelled Campaign did not return")
	}
	if err := waiter.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	mustVacant(t, h, key) // the cancelled candidate left no entry
}

// NewMutex returns a Mutex on a new client of h's backend, closed at the end
// of the test.
func (h Harness) NewMutex(t testing.TB, key, identity string) (*election.Mutex, election.Backend) {
	t.Helper()
	b := h.NewBackend(t)
	m, err := election.NewMutex(b, election.Config{Key: key, Identity: identity, TTL: h.TTL})
	if err != nil {
		t.Fatalf("election.NewMutex: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*h.TTL)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m, b
}

func testMutexArrivalOrder(t *testing.T, h Harness) {
	key := Key(t)
	arrivalOrder(t, h, 30*h.TTL, func(id string) candidate {
		m, _ := h.NewMutex(t, key, id)
		return candidate{
			acquire:  func(ctx context.Context) error { _, err := m.Lock(ctx); return err },
			release:  m.Unlock,
			position: m.Position,
		}
	})
}

func testMutexTryLock(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	holder, _ := h.NewMutex(t, key, "holder")
	th, err := holder.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock on a free lock: %v", err)
	}
	var wg sync.WaitGroup
	var locked atomic.Int32
	var others []*election.Mutex
	for i := range 5 {
		m, _ := h.NewMutex(t, key, fmt.Sprintf("t%d", i))
		others = append(others, m)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := m.TryLock(ctx); !errors.Is(err, tenure.ErrLocked) {
				t.Errorf("TryLock under contention = %v, want ErrLocked", err)
				locked.Add(1)
			}
		}()
	}
	wg.Wait()
	if locked.Load() != 0 || !holder.Held() {
		t.Fatal("the holder lost the lock to a TryLock")
	}
	if _, err := holder.TryLock(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Fatalf("TryLock by the holder's own process = %v, want ErrLocked", err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v (Unlock is idempotent)", err)
	}
	// The refused TryLocks left nothing behind: the lock is free.
	mustVacant(t, h, key)
	tn, err := others[0].TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if tn.Token <= th.Token {
		t.Fatalf("term %d not above %d", tn.Token, th.Token)
	}
}

func testMutexLoss(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	a, ba := h.NewMutex(t, key, "a")
	if _, err := a.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	lockCtx := a.Context()
	b, _ := h.NewMutex(t, key, "b")
	bAt := make(chan time.Time, 1)
	go func() {
		if _, err := b.Lock(ctx); err != nil {
			t.Errorf("b: %v", err)
			return
		}
		bAt <- time.Now()
	}()
	WaitFor(t, 5*h.TTL, "b to queue", func() bool { p, err := b.Position(ctx); return err == nil && p == 1 })
	heal := h.CutOff(t, ba)
	defer heal()
	<-lockCtx.Done()
	lostAt := time.Now()
	select {
	case <-a.Done():
	default:
		t.Fatal("Done not closed with the lock's context")
	}
	if !errors.Is(a.Err(), tenure.ErrLeaseExpired) || !errors.Is(context.Cause(lockCtx), tenure.ErrLeaseExpired) {
		t.Fatalf("lost with %v / %v, want ErrLeaseExpired", a.Err(), context.Cause(lockCtx))
	}
	select {
	case at := <-bAt:
		if !at.After(lostAt) {
			t.Fatalf("b locked at %v, before a's context ended at %v", at, lostAt)
		}
		t.Logf("a's lock context ended %v before b locked", at.Sub(lostAt))
	case <-time.After(3 * h.TTL):
		t.Fatal("b never got the lock")
	}
}

func testMutexGoroutines(t *testing.T, h Harness) {
	key := Key(t)
	m, _ := h.NewMutex(t, key, "p")
	ctx := ctxT(t, 10*h.TTL)
	var inside, overlaps, rounds atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 5 {
				if _, err := m.Lock(ctx); err != nil {
					t.Errorf("Lock: %v", err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				rounds.Add(1)
				if err := m.Unlock(ctx); err != nil {
					t.Errorf("Unlock: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 || rounds.Load() != 20 {
		t.Fatalf("%d overlaps in %d rounds: goroutines of one process must take turns", overlaps.Load(), rounds.Load())
	}
}

// testMutexExtraUnlock: an Unlock with nothing held must not let a second
// goroutine of the process in beside the one holding or queueing.
func testMutexExtraUnlock(t *testing.T, h Harness) {
	key := Key(t)
	ctx := ctxT(t, 10*h.TTL)
	other, _ := h.NewMutex(t, key, "other")
	if _, err := other.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	m, _ := h.NewMutex(t, key, "p")
	var holding atomic.Int32
	var most atomic.Int32
	lock := func() {
		if _, err := m.Lock(ctx); err != nil {
			t.Errorf("Lock: %v", err)
			return
		}
		n := holding.Add(1)
		for {
			x := most.Load()
			if n <= x || most.CompareAndSwap(x, n) {
				break
			}
		}
	}
	go lock() // B: takes the local slot and queues behind "other"
	WaitFor(t, 5*h.TTL, "B to queue", func() bool { p, err := m.Position(ctx); return err == nil && p == 1 })
	if err := m.Unlock(ctx); err != nil { // A: unlocks what it never locked
		t.Fatalf("Unlock without a hold: %v", err)
	}
	go lock() // C: must wait for B's Unlock
	time.Sleep(h.TTL / 10)
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, 5*h.TTL, "B to hold", func() bool { return holding.Load() >= 1 })
	time.Sleep(h.TTL / 5)
	if n := most.Load(); n != 1 {
		t.Fatalf("%d goroutines held the Mutex at once after an extra Unlock", n)
	}
	holding.Add(-1)
	if err := m.Unlock(ctx); err != nil { // B lets C in
		t.Fatal(err)
	}
	WaitFor(t, 5*h.TTL, "C to hold", func() bool { return holding.Load() == 1 })
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// testMutexCloseWakesLocalWaiters: Close ends Locks waiting behind another
// goroutine of the process with ErrClosed.
func testMutexCloseWakes(t *testing.T, h Harness) {
	key := Key(t)
	m, _ := h.NewMutex(t, key, "p")
	if _, err := m.Lock(ctxT(t, 5*h.TTL)); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	go func() { _, err := m.Lock(context.Background()); res <- err }()
	time.Sleep(h.TTL / 10)
	if err := m.Close(ctxT(t, 2*h.TTL)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-res:
		if !errors.Is(err, tenure.ErrClosed) {
			t.Fatalf("waiting Lock after Close = %v, want ErrClosed", err)
		}
	case <-time.After(2 * h.TTL):
		t.Fatal("a Lock waiting behind the holder did not return after Close")
	}
}

// testDeletedEntry: the holder's entry is deleted behind its back (an
// operator unsticking a lock, a server restart that lost it). Run's term
// ends with tenure.ErrOwnershipLost, and its next campaign, on the same
// elector and session, is elected with a larger token and keeps its term:
// nothing of the spent entry (its loss signal, its token) is reused.
func testDeletedEntry(t *testing.T, h Harness) {
	ctx := ctxT(t, 30*time.Second+8*h.TTL)
	e, _ := h.NewElector(t, Key(t), "a")
	type event struct {
		elected bool
		term    tenure.Term
		reason  error
	}
	events := make(chan event, 8)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() {
		runErr <- e.Run(runCtx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				events <- event{elected: true, term: term}
				<-lctx.Done()
			},
			OnDemoted: func(term tenure.Term, reason error) { events <- event{term: term, reason: reason} },
		})
	}()
	next := func(what string, within time.Duration) event {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(within):
			t.Fatalf("no %s within %v", what, within)
			return event{}
		}
	}
	first := next("election", 10*time.Second)
	if !first.elected {
		t.Fatalf("first event %+v, want an election", first)
	}
	deleted := time.Now()
	h.DeleteEntry(t, first.term)
	demoted := next("demotion after the entry was deleted", 2*h.TTL)
	if demoted.elected || demoted.term.Token != first.term.Token || !errors.Is(demoted.reason, tenure.ErrOwnershipLost) {
		t.Fatalf("after the delete: %+v, want term %d demoted with ErrOwnershipLost", demoted, first.term.Token)
	}
	lostAfter := time.Since(deleted)
	second := next("election after the demotion", 2*h.TTL+5*time.Second)
	if !second.elected || second.term.Token <= first.term.Token {
		t.Fatalf("after the demotion: %+v, want an election with a token above %d", second, first.term.Token)
	}
	// The new term holds across renewals (TTL/3 each by default).
	select {
	case ev := <-events:
		t.Fatalf("the new term ended at once: %+v", ev)
	case <-time.After(h.TTL):
	}
	if !e.IsLeader() {
		t.Fatal("IsLeader is false during the new term")
	}
	stop()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("term %d demoted %v after its entry was deleted; term %d elected and held",
		first.term.Token, lostAfter.Round(time.Millisecond), second.term.Token)
}

// testSessionCloseEndsWaits: a WaitHead and a WatchLoss in progress on
// a session, and ones called after it closed, return at once with why
// (the session's end, or the entry gone with it), not when their context
// ends: a caller that waits on them with a long-lived context (Run's)
// would otherwise wait for good.
func testSessionCloseEndsWaits(t *testing.T, h Harness) {
	ctx := ctxT(t, 10*h.TTL)
	key, held := Key(t), Key(t)+"-held"
	open := func(b election.Backend) election.Session {
		s, err := b.OpenSession(ctx, election.SessionOptions{TTL: h.TTL, RenewInterval: h.TTL / 3, Now: time.Now})
		if err != nil {
			t.Fatalf("OpenSession: %v", err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	other := open(h.NewBackend(t))
	oh, err := other.Enqueue(ctx, key, "other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.WaitHead(ctx, oh); err != nil {
		t.Fatalf("the other session's WaitHead: %v", err)
	}
	s := open(h.NewBackend(t))
	waiting, err := s.Enqueue(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	mine, err := s.Enqueue(ctx, held, "h")
	if err != nil {
		t.Fatal(err)
	}
	if mine, err = s.WaitHead(ctx, mine); err != nil {
		t.Fatalf("WaitHead on a free key: %v", err)
	}
	ended := func(what string, err error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s after the session closed: nil error", what)
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
			t.Errorf("%s returned only when its context ended: %v", what, err)
		case !errors.Is(err, tenure.ErrClosed) && !errors.Is(err, tenure.ErrSessionExpired) && !errors.Is(err, tenure.ErrOwnershipLost):
			t.Errorf("%s = %v, want ErrClosed, ErrSessionExpired or ErrOwnershipLost", what, err)
		}
	}
	waitErr, lossErr := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := s.WaitHead(ctx, waiting)
		waitErr <- err
	}()
	go func() { lossErr <- s.WatchLoss(ctx, mine) }()
	time.Sleep(100 * time.Millisecond) // both are waiting
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	bound := h.TTL
	for what, ch := range map[string]chan error{"WaitHead in progress": waitErr, "WatchLoss in progress": lossErr} {
		select {
		case err := <-ch:
			ended(what, err)
		case <-time.After(bound):
			t.Errorf("%s had not returned %v after the session closed", what, bound)
		}
	}
	for what, f := range map[string]func(context.Context) error{
		"WaitHead called after Close":  func(ctx context.Context) error { _, err := s.WaitHead(ctx, waiting); return err },
		"WatchLoss called after Close": func(ctx context.Context) error { return s.WatchLoss(ctx, mine) },
	} {
		cctx, cancel := context.WithTimeout(ctx, bound)
		start := time.Now()
		err := f(cctx)
		cancel()
		ended(what, err)
		if d := time.Since(start); d >= bound {
			t.Errorf("%s took %v", what, d)
		}
	}
}
