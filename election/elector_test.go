package election_test

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
	"github.com/tenure-go/tenure/election/electiontest"
)

// within runs f and fails t when it has not returned within d; it returns
// f's error.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still blocked after %v", what, d)
		return nil
	}
}

// repeat calls f until stop is closed.
func repeat(stop <-chan struct{}, f func()) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		f()
	}
}

// runStubborn runs e.Run until ctx ends, with elected work that ignores
// its cancelled context (and a hard stop that does not end it) until
// release is closed. It returns once e leads; working reports whether the
// work runs.
func runStubborn(ctx context.Context, e *election.Elector) (working *atomic.Bool, release chan struct{}, runDone chan error) {
	working, release, runDone = new(atomic.Bool), make(chan struct{}), make(chan error, 1)
	elected := make(chan struct{})
	go func() {
		runDone <- e.Run(ctx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				working.Store(true)
				close(elected)
				<-ctx.Done()
				<-release
				working.Store(false)
			},
			OnHardStop: func(tenure.Term) {},
		})
	}()
	<-elected
	return working, release, runDone
}

// TestCampaign_SecondCallHonoursItsContext: while one campaign of an
// elector waits in the queue, a second Campaign or Run on it gives up when
// its own ctx ends, and TryCampaign does not wait at all. All three waited
// for the first campaign before, however long it waited.
func TestCampaign_SecondCallHonoursItsContext(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second)
	b, _ := newElector(t, srv, key, "b", time.Second)
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	first, stopFirst := context.WithCancel(ctx)
	firstDone := make(chan error, 1)
	go func() { _, err := b.Campaign(first); firstDone <- err }()
	electiontest.WaitFor(t, 5*time.Second, "b's first campaign to queue", func() bool { return srv.Entries(key) == 2 })

	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	err := within(t, 5*time.Second, "a second Campaign with a 100 ms ctx", func() error { _, err := b.Campaign(short()); return err })
	if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second Campaign: %v, want ErrCanceled joined with the deadline", err)
	}
	err = within(t, 5*time.Second, "Run with a 100 ms ctx", func() error { return b.Run(short(), tenure.Callbacks{}) })
	if !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("Run: %v, want ErrCanceled", err)
	}
	begun := time.Now()
	err = within(t, 5*time.Second, "TryCampaign", func() error { _, err := b.TryCampaign(ctx); return err })
	if !errors.Is(err, tenure.ErrLocked) || time.Since(begun) > time.Second {
		t.Errorf("TryCampaign during a campaign: %v after %v, want ErrLocked at once", err, time.Since(begun))
	}
	stopFirst()
	if err := <-firstDone; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("first campaign: %v", err)
	}
	electiontest.WaitFor(t, 5*time.Second, "b's entry to go", func() bool { return srv.Entries(key) == 1 })
}

// TestRun_CampaignWhileTheWorkStopsKeepsTheTerm: a Campaign (or
// TryCampaign) on the elector while Run's term ends and its elected work is
// still stopping must neither delete that term's entry (electing the next
// candidate during the work) nor let Run's resignation end the new term.
// Before, the campaign found the term's entry, replaced it, and Run then
// resigned the new term.
func TestRun_CampaignWhileTheWorkStopsKeepsTheTerm(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
	b, _ := newElector(t, srv, key, "b", time.Second)
	var working atomic.Bool
	elected := make(chan tenure.Term, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(runCtx, tenure.Callbacks{
			OnElected: func(ctx context.Context, term tenure.Term) {
				working.Store(true)
				elected <- term
				<-ctx.Done()
				time.Sleep(60 * time.Millisecond) // stops within StopTimeout
				working.Store(false)
			},
			OnHardStop: func(tenure.Term) {}, // a loaded machine: not the default exit
		})
	}()
	t1 := <-elected
	var bWhileWorking atomic.Bool
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Campaign(ctx)
		if err == nil {
			bWhileWorking.Store(working.Load())
			err = b.Resign(ctx) // and a's new campaign behind it leads
		}
		bDone <- err
	}()
	electiontest.WaitFor(t, 5*time.Second, "b to queue", func() bool { return srv.Entries(key) == 2 })

	stopRun() // Run stops the work, then resigns term 1
	electiontest.WaitFor(t, 5*time.Second, "a's term to end", func() bool { return !a.IsLeader() })
	if _, err := a.TryCampaign(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Errorf("TryCampaign while the work stops: %v, want ErrLocked", err)
	}
	t2, err := a.Campaign(ctx) // waits for the work, then queues behind b
	if err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	if bWhileWorking.Load() {
		t.Error("b was elected while a's elected work was still running")
	}
	if err := <-runDone; !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("Run: %v", err)
	}
	if t2.Token <= t1.Token {
		t.Errorf("a's new term %d, not above its old %d", t2.Token, t1.Token)
	}
	if !a.IsLeader() || a.Err() != nil {
		t.Errorf("a's new term %d after Run returned: leads %v, Err %v; Run's resignation must not touch it", t2.Token, a.IsLeader(), a.Err())
	}
}

// TestRun_CampaignAfterTheDeadlineLeavesTheHeldLease: a leader cut off past
// its deadline whose work ignores its context keeps its session (and so its
// entry) until the work returns, even when the link comes back and a
// campaign on the elector runs meanwhile. Before, that campaign closed the
// session and the next candidate led while the work still ran.
func TestRun_CampaignAfterTheDeadlineLeavesTheHeldLease(t *testing.T) {
	srv, key, ctx := setup(t)
	p := startPastDeadline(t, ctx, srv, key)
	if _, err := p.a.TryCampaign(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Errorf("TryCampaign while the work runs: %v, want ErrLocked", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := p.a.Campaign(cctx)
	cancel()
	if !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("Campaign while the work runs: %v, want ErrCanceled after its 200 ms", err)
	}
	p.finish(t)
}

// TestClose_AfterTheDeadlineWaitsForTheWorkBeforeReleasing: a leader cut
// off past its deadline, whose work ignores its cancelled context and whose
// OnHardStop does not exit, keeps its entry once the link is back (the
// session is renewed again) until the work returns. A Close whose ctx ends
// while it waits for the work leaves the rest to the background, "once the
// work returns": its stop of the lease ended the monitor's wait for the
// work, the session was closed, and b was elected while a's work still ran.
func TestClose_AfterTheDeadlineWaitsForTheWorkBeforeReleasing(t *testing.T) {
	srv, key, ctx := setup(t)
	p := startPastDeadline(t, ctx, srv, key)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := p.a.Close(cctx)
	cancel()
	if !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("Close while the work runs: %v, want ErrCanceled after its 200 ms", err)
	}
	p.finish(t)
}

// pastDeadline is a leader, a, whose term ended at its lease deadline
// while it was cut off, whose work under Run ignores its context (and
// whose OnHardStop does not stop it), with the link back; and b,
// campaigning behind it.
type pastDeadline struct {
	srv           *electiontest.Memory
	key           string
	a             *election.Elector
	working       *atomic.Bool
	release       chan struct{}
	runDone       chan error
	stopRun       context.CancelFunc
	bWhileWorking atomic.Bool
	bDone         chan error
}

// startPastDeadline sets up a pastDeadline. The margin (1.5 s) leaves
// room for a renewal (every 0.5 s) after the heal, before the server could
// expire the session: the session survives, so only the elector could
// release the entry.
func startPastDeadline(t *testing.T, ctx context.Context, srv *electiontest.Memory, key string) *pastDeadline {
	t.Helper()
	cfg := election.Config{Key: key, Identity: "a", TTL: 3 * time.Second, RenewInterval: 500 * time.Millisecond, DeadlineMargin: 1500 * time.Millisecond}
	ac := srv.Client()
	a, err := election.New(ac, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, _ := newElector(t, srv, key, "b", 3*time.Second)
	p := &pastDeadline{srv: srv, key: key, a: a, bDone: make(chan error, 1)}
	runCtx, stopRun := context.WithCancel(ctx)
	t.Cleanup(stopRun)
	p.stopRun = stopRun
	p.working, p.release, p.runDone = runStubborn(runCtx, a)
	heal := ac.CutOff()
	go func() {
		_, err := b.Campaign(ctx)
		if err == nil && p.working.Load() {
			p.bWhileWorking.Store(true)
		}
		p.bDone <- err
	}()
	// The term ended at its deadline. Not just !IsLeader, which turns
	// false on the clock before the lease acts on it: a renewal that comes
	// in between (after the heal) keeps the term, and the test waited for
	// b for good (a fresh-clone CI run, 2026-11-30).
	electiontest.WaitFor(t, 10*time.Second, "a's term to end at its deadline", func() bool { return errors.Is(a.Err(), tenure.ErrLeaseExpired) })
	heal()
	return p
}

// finish checks that a's entry and b's still stand past the margin after
// the deadline, returns a's work, and checks that b is elected only then.
func (p *pastDeadline) finish(t *testing.T) {
	t.Helper()
	time.Sleep(2 * time.Second)
	if n := p.srv.Entries(p.key); n != 2 || p.bWhileWorking.Load() {
		t.Errorf("%d entries while a's work still runs (b elected: %v), want a's and b's", n, p.bWhileWorking.Load())
	}
	close(p.release)
	select {
	case err := <-p.bDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("b not elected 30s after a's work returned")
	}
	if p.bWhileWorking.Load() {
		t.Error("b was elected while a's elected work was still running")
	}
	p.stopRun()
	<-p.runDone
}

// ptrClock is a Clock whose Now reads its receiver.
type ptrClock struct{ now time.Time }

func (c *ptrClock) Now() time.Time { return c.now }

// TestWithClock_ANilPointerIsTheSystemClock: WithClock of a nil *T (a Clock
// whose Now reads its receiver) keeps the system clock, as a nil Clock
// does. It was taken, and the first Campaign panicked.
func TestWithClock_ANilPointerIsTheSystemClock(t *testing.T) {
	srv, key, ctx := setup(t)
	var c *ptrClock
	e, _ := newElector(t, srv, key, "a", time.Second, election.WithClock(c))
	done := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic: %v", r)
			}
		}()
		_, err := e.Campaign(ctx)
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatalf("Campaign with WithClock of a nil *ptrClock: %v", err)
	}
	if !e.IsLeader() {
		t.Fatal("not leader after Campaign")
	}
}

// TestClose_ConcurrentCloseWaitsForTheFirst: a second Close returns only
// once the first has finished (work returned, entry gone). It returned nil
// at once before.
func TestClose_ConcurrentCloseWaitsForTheFirst(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second)
	working, release, runDone := runStubborn(ctx, a)
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Close(ctx) })
	electiontest.WaitFor(t, 5*time.Second, "the first Close to start", func() bool {
		st := a.Status(ctx)
		return st.State == "closed"
	})
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := a.Close(short); !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("second Close while the first waits for the work: %v, want ErrCanceled after its ctx", err)
	}
	second := make(chan error, 1)
	go func() { second <- a.Close(ctx) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := <-second; err != nil {
		t.Errorf("second Close: %v", err)
	}
	if working.Load() || srv.Entries(key) != 0 {
		t.Errorf("second Close returned with the work running %v, %d entries left", working.Load(), srv.Entries(key))
	}
	wg.Wait()
	<-runDone
}

// TestPosition_DuringCampaigns: Position reads the campaign's ticket while
// the campaign updates it (a data race under -race before).
func TestPosition_DuringCampaigns(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second)
	b, _ := newElector(t, srv, key, "b", time.Second)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { repeat(stop, func() { _, _ = b.Position(ctx) }) })
	for range 20 {
		if _, err := a.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		bDone := make(chan error, 1)
		go func() { _, err := b.Campaign(ctx); bDone <- err }()
		if err := a.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-bDone; err != nil {
			t.Fatal(err)
		}
		if err := b.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}

// TestNew_BadOptionsAndEveryProblem: a nil Option is ignored (it panicked
// before), and Validate reports each bad duration, not the first only.
func TestNew_BadOptionsAndEveryProblem(t *testing.T) {
	srv, key, _ := setup(t)
	e, err := election.New(srv.Client(), election.Config{Key: key, TTL: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Close(context.Background())
	err = election.Config{Key: key, Identity: "a", TTL: time.Second, RenewInterval: -1, DeadlineMargin: -1, StopTimeout: 1, RetryInterval: 1, CleanupTimeout: 1}.Validate()
	if !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "RenewInterval") || !strings.Contains(err.Error(), "DeadlineMargin") {
		t.Errorf("Validate with two bad durations: %v, want both named", err)
	}
}

// TestRun_CampaignsRacingAResignNeverCutTheWorkShort: Campaigns of the
// leader's own elector, looping while another goroutine resigns Run's
// term, never delete that term's entry while its elected work stops. A
// check of "is the work still stopping" made before the term ended let a
// campaign through after it ended (b led during a's work, after 16-74
// iterations).
func TestRun_CampaignsRacingAResignNeverCutTheWorkShort(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", 2*time.Second) // StopTimeout 200 ms
	b, _ := newElector(t, srv, key, "b", 2*time.Second)
	var working atomic.Uint64
	elected := make(chan tenure.Term)
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(runCtx, tenure.Callbacks{OnElected: func(wctx context.Context, term tenure.Term) {
			working.Store(term.Token)
			select {
			case elected <- term:
			case <-wctx.Done():
			}
			<-wctx.Done()
			time.Sleep(20 * time.Millisecond) // stopping, within StopTimeout
			working.Store(0)
		}, OnHardStop: func(tenure.Term) {}}) // a loaded machine: not the default exit
	}()
	for i := range 60 {
		term := <-elected
		overlap := make(chan uint64, 1)
		go func() {
			_, err := b.Campaign(ctx)
			var w uint64
			if err == nil {
				w = working.Load()
				_ = b.Resign(ctx)
			}
			overlap <- w
		}()
		electiontest.WaitFor(t, 5*time.Second, "b to queue", func() bool { return srv.Entries(key) == 2 })
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				repeat(stop, func() {
					c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					_, _ = a.Campaign(c)
					cancel()
				})
			})
		}
		time.Sleep(time.Millisecond)
		_ = a.Resign(ctx)
		close(stop)
		wg.Wait()
		if w := <-overlap; w != 0 {
			t.Fatalf("iteration %d: b led while a's elected work of term %d (ended: %d) still ran", i, w, term.Token)
		}
	}
	stopRun()
	<-runDone
}

// refusingBackend refuses every enqueue as a configuration error, after
// ending its session, as etcdelect does when it may have written an entry
// it is not allowed to delete (permission denied).
type refusingBackend struct{ *electiontest.Client }

func (b refusingBackend) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	s, err := b.Client.OpenSession(ctx, opts)
	if err != nil {
		return nil, err
	}
	return refusingSession{s}, nil
}

type refusingSession struct{ election.Session }

func (s refusingSession) Enqueue(context.Context, string, string) (election.Ticket, error) {
	s.Session.(interface{ End(error) bool }).End(fmt.Errorf("%w: gave up after a refused write", tenure.ErrSessionExpired))
	time.Sleep(50 * time.Millisecond) // the lease notices the end meanwhile
	return election.Ticket{}, fmt.Errorf("%w: permission denied", tenure.ErrInvalidConfig)
}

// TestCampaign_ARefusalIsReportedAsSuch: a campaign the backend refused
// (ErrInvalidConfig) reports that, even when the backend ended its session
// because of it. It reported ErrSessionExpired whenever the lease noticed
// the end first (an etcd permission test failed on it under load).
func TestCampaign_ARefusalIsReportedAsSuch(t *testing.T) {
	srv, key, ctx := setup(t)
	e, err := election.New(refusingBackend{srv.Client()}, election.Config{Key: key, Identity: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	if _, err := e.Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Campaign refused by the backend: %v, want ErrInvalidConfig", err)
	}
}

// slowGrant is a memory client whose OpenSession answers 200 ms late,
// whatever its ctx (a Grant already answered when Close cancels it), and
// records when the session it opened is closed.
type slowGrant struct {
	*electiontest.Client
	closedAt *atomic.Int64
	opening  chan struct{} // closed when OpenSession is called
}

func (b slowGrant) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	close(b.opening)
	time.Sleep(200 * time.Millisecond)
	s, err := b.Client.OpenSession(context.Background(), opts)
	if err != nil {
		return nil, err
	}
	return closeSpy{s, b.closedAt}, nil
}

type closeSpy struct {
	election.Session
	at *atomic.Int64
}

func (s closeSpy) Close(ctx context.Context) error {
	err := s.Session.Close(ctx)
	s.at.Store(time.Now().UnixNano())
	return err
}

// TestClose_WaitsForTheSessionACampaignIsOpening: Close waits for what the
// elector started; a session that a campaign was opening when Close came
// is closed before Close returns, not by a goroutine left behind.
func TestClose_WaitsForTheSessionACampaignIsOpening(t *testing.T) {
	srv, key, ctx := setup(t)
	var closedAt atomic.Int64
	opening := make(chan struct{})
	e, err := election.New(slowGrant{srv.Client(), &closedAt, opening}, election.Config{Key: key, Identity: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	campaigned := make(chan error, 1)
	go func() {
		_, err := e.Campaign(ctx)
		campaigned <- err
	}()
	<-opening // the campaign is opening its session
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	c := closedAt.Load()
	if c == 0 || time.Unix(0, c).After(returned) {
		t.Fatalf("Close returned before the session the campaign opened was closed (closed at %v, 0: not yet)", c)
	}
	if err := <-campaigned; !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("Campaign = %v, want ErrClosed", err)
	}
}

// faultyBackend lets a test end a term's loss watch with a transient
// error (a broken watch: the term ends, its entry and session stay) and
// make the next Dequeue calls fail.
type faultyBackend struct {
	*electiontest.Client
	mu          *sync.Mutex
	breakWatch  *chan struct{} // closed: WatchLoss returns errWatchBroke
	failDequeue *atomic.Int32  // Dequeue calls left to fail
}

var (
	errWatchBroke    = fmt.Errorf("%w: watch broke", tenure.ErrUnavailable)
	errDequeueFailed = fmt.Errorf("%w: delete failed", tenure.ErrUnavailable)
)

// mendWatches makes the loss watches started from now on run until
// breakWatches.
func (b faultyBackend) mendWatches() {
	b.mu.Lock()
	defer b.mu.Unlock()
	*b.breakWatch = make(chan struct{})
}

// breakWatches makes the loss watches started since mendWatches return
// errWatchBroke, at once or when they start.
func (b faultyBackend) breakWatches() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(*b.breakWatch)
}

func (b faultyBackend) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	s, err := b.Client.OpenSession(ctx, opts)
	if err != nil {
		return nil, err
	}
	return faultySession{s, b}, nil
}

type faultySession struct {
	election.Session
	b faultyBackend
}

func (s faultySession) WatchLoss(ctx context.Context, t election.Ticket) error {
	s.b.mu.Lock()
	broke := *s.b.breakWatch
	s.b.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Session.WatchLoss(ctx, t) }()
	select {
	case err := <-done:
		return err
	case <-broke:
		cancel()
		<-done
		return errWatchBroke
	}
}

func (s faultySession) Dequeue(ctx context.Context, t election.Ticket) error {
	if s.b.failDequeue.Add(-1) >= 0 {
		return errDequeueFailed
	}
	return s.Session.Dequeue(ctx, t)
}

// TestCampaign_FailedDeleteOfAnEndedTermsEntryIsCleanedUp: a campaign that
// finds its session's entry from an ended term (its loss watch broke)
// deletes it to queue afresh with a larger token. When that delete fails,
// the campaign fails with the delete's error, and the entry is still
// removed so that it does not block the queue: by another try on a fresh
// context, or, when that fails too, with the session, given up. The
// elector can campaign again. Before c97bb0e the entry stayed at the head
// of the queue; before 6f5dfcd a campaign whose clean-up gave up the
// session could report ErrClosed (caught in 5 of 5 runs under -race, as
// make test runs this package, and in none of 3 without).
func TestCampaign_FailedDeleteOfAnEndedTermsEntryIsCleanedUp(t *testing.T) {
	srv, key, ctx := setup(t)
	var broke chan struct{}
	fb := faultyBackend{Client: srv.Client(), mu: &sync.Mutex{}, breakWatch: &broke, failDequeue: &atomic.Int32{}}
	a, err := election.New(fb, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	b, err := election.New(srv.Client(), election.Config{Key: key, Identity: "b", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	var last uint64
	// 1: the clean-up's own delete succeeds; 2: it fails too, and the
	// session is given up. That one is repeated: the session stops in the
	// background, and the campaign's error was wrong only when the stop
	// came before the error was classified.
	rounds := []int32{1}
	for range 300 {
		rounds = append(rounds, 2)
	}
	for _, failures := range rounds {
		fb.mendWatches()
		term, err := a.Campaign(ctx)
		if err != nil {
			t.Fatalf("%d failures: Campaign: %v", failures, err)
		}
		if term.Token <= last {
			t.Fatalf("term %d after term %d: tokens must grow", term.Token, last)
		}
		last = term.Token
		fb.breakWatches()
		for a.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		if n := srv.Entries(key); n != 1 {
			t.Fatalf("%d failures: %d entries after the term's watch broke, want its entry still there", failures, n)
		}
		fb.failDequeue.Store(failures)
		_, err = a.Campaign(ctx)
		if !errors.Is(err, errDequeueFailed) || errors.Is(err, tenure.ErrClosed) || errors.Is(err, tenure.ErrSessionExpired) {
			t.Fatalf("%d failures: Campaign whose delete of the ended term's entry failed: %v, want the delete's error", failures, err)
		}
		// A session given up is closed in the background.
		for deadline := time.Now().Add(2 * time.Second); srv.Entries(key) != 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if n := srv.Entries(key); n != 0 {
			t.Fatalf("%d failures: %d entries left 2s after the failed campaign, want 0: the ended term's entry blocks the queue", failures, n)
		}
		bctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = b.Campaign(bctx)
		cancel()
		if err != nil {
			t.Fatalf("%d failures: another candidate's campaign after the clean-up: %v", failures, err)
		}
		if err := b.Resign(ctx); err != nil {
			t.Fatal(err)
		}
	}
	fb.mendWatches()
	if term, err := a.Campaign(ctx); err != nil || term.Token <= last {
		t.Fatalf("the elector's last campaign: term %d, %v; want one above %d", term.Token, err, last)
	}
}

// TestRun_CloseWhileWaitingToRetryReturnsAtOnce: Run's campaigns fail (the
// backend is unreachable) and Run waits RetryInterval between them. Close
// must end that wait: Run returns ErrClosed at once, not after the pause.
func TestRun_CloseWhileWaitingToRetryReturnsAtOnce(t *testing.T) {
	srv, key, ctx := setup(t)
	c := srv.Client()
	c.Crash()
	const pause = 10 * time.Second
	e, err := election.New(c, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second, RetryInterval: pause})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- e.Run(ctx, tenure.Callbacks{}) }()
	time.Sleep(200 * time.Millisecond) // the first campaign has failed; Run waits to retry
	start := time.Now()
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-runDone:
		if !errors.Is(err, tenure.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("Run returned %v after Close (RetryInterval %v)", d, pause)
		}
	case <-time.After(pause + 5*time.Second):
		t.Fatal("Run did not return after Close")
	}
}

// TestRun_SessionGivenUpIsNotAClose: Run's term ends (its entry deleted by
// someone else), Run campaigns again on the same session behind another
// leader, and a Resign from another goroutine fails to delete the ended
// term's entry (the link is down), so the elector gives the session up.
// That is no Close: Run must campaign again on a new session, not return
// ErrClosed for good.
func TestRun_SessionGivenUpIsNotAClose(t *testing.T) {
	srv, key, ctx := setup(t)
	const ttl = 2 * time.Second
	a, ac := newElector(t, srv, key, "a", ttl)
	b, _ := newElector(t, srv, key, "b", ttl)
	elected := make(chan tenure.Term, 4)
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(ctx, tenure.Callbacks{OnElected: func(lctx context.Context, term tenure.Term) {
			elected <- term
			<-lctx.Done()
		}})
	}()
	var t1 tenure.Term
	select {
	case t1 = <-elected:
	case <-time.After(5 * time.Second):
		t.Fatal("a not elected")
	}
	bTerm := make(chan tenure.Term, 1)
	go func() {
		tn, err := b.Campaign(ctx)
		if err != nil {
			t.Errorf("b: %v", err)
		}
		bTerm <- tn
	}()
	electiontest.WaitFor(t, 5*time.Second, "b to queue", func() bool { return srv.Entries(key) == 2 })
	if !srv.DeleteEntry(key, t1.Token) {
		t.Fatal("could not delete a's entry")
	}
	tb := <-bTerm
	electiontest.WaitFor(t, 5*time.Second, "a to queue again behind b", func() bool { return srv.Entries(key) == 2 })
	heal := ac.CutOff()
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err := a.Resign(rctx)
	cancel()
	heal()
	if err == nil {
		t.Fatal("Resign with the link down succeeded; the test needs it to fail")
	}
	select {
	case err := <-runDone:
		t.Fatalf("Run returned %v after a failed Resign gave its session up; it must campaign again", err)
	case <-time.After(time.Second):
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case t2 := <-elected:
		if t2.Token <= tb.Token {
			t.Errorf("a's new token %d not above b's %d", t2.Token, tb.Token)
		}
	case err := <-runDone:
		t.Fatalf("Run returned %v instead of leading again", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a not elected again after b resigned")
	}
}

// TestRun_PanicInOnElectedKeepsWhyTheTermEnded: a panic in OnElected
// during a live term is a resignation (ErrResigned and ErrCallbackPanic)
// and Run campaigns again; a panic in work that was winding down after
// its session expired keeps ErrSessionExpired as the reason. Before, that
// reason was replaced by ErrResigned, and OnDemoted could not tell that
// another leader might already run.
func TestRun_PanicInOnElectedKeepsWhyTheTermEnded(t *testing.T) {
	srv, key, ctx := setup(t)
	e, _ := newElector(t, srv, key, "a", time.Second)
	elected := make(chan int, 4)
	reasons := make(chan error, 4)
	runCtx, stop := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	var terms atomic.Int32
	go func() {
		runDone <- e.Run(runCtx, tenure.Callbacks{
			OnElected: func(lctx context.Context, _ tenure.Term) {
				n := int(terms.Add(1))
				elected <- n
				if n == 1 {
					panic("while leading")
				}
				<-lctx.Done()
				if n == 2 {
					panic("while stopping")
				}
			},
			OnDemoted:  func(_ tenure.Term, reason error) { reasons <- reason },
			OnHardStop: func(tenure.Term) {},
		})
	}()
	next := func(what string) error {
		t.Helper()
		select {
		case err := <-reasons:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("no OnDemoted for %s within 10 s", what)
			return nil
		}
	}
	<-elected
	if err := next("the term whose work panicked"); !errors.Is(err, tenure.ErrResigned) || !errors.Is(err, tenure.ErrCallbackPanic) {
		t.Errorf("a panic during a live term: reason %v, want ErrResigned and ErrCallbackPanic", err)
	}
	select {
	case <-elected:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not lead again after the panic")
	}
	if !srv.ExpireSession(key, "a") {
		t.Fatal("no session to expire")
	}
	err := next("the term whose session expired")
	if !errors.Is(err, tenure.ErrSessionExpired) || !errors.Is(err, tenure.ErrCallbackPanic) || errors.Is(err, tenure.ErrResigned) {
		t.Errorf("a panic after the session expired: reason %v, want ErrSessionExpired and ErrCallbackPanic, not ErrResigned", err)
	}
	stop()
	if err := <-runDone; !errors.Is(err, tenure.ErrCanceled) {
		t.Errorf("Run: %v, want ErrCanceled", err)
	}
}

// TestLeaseExpiredError_CarriesTheDeadline: a term that ends at its lease
// deadline says which deadline it was, so that a process paused past it
// can tell, when it runs again, how long ago its term really ended.
func TestLeaseExpiredError_CarriesTheDeadline(t *testing.T) {
	srv, key, ctx := setup(t)
	a, ac := newElector(t, srv, key, "a", 2*time.Second)
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	ac.CutOff()
	// No renewal is acknowledged from here on: the deadline stops moving
	// once the renewals in flight are answered.
	var last time.Time
	electiontest.WaitFor(t, 10*time.Second, "a's term to end at its deadline", func() bool {
		if d := a.Deadline(); !d.IsZero() {
			last = d
		}
		return a.Err() != nil
	})
	var lee *election.LeaseExpiredError
	if !errors.As(a.Err(), &lee) || !errors.Is(a.Err(), tenure.ErrLeaseExpired) {
		t.Fatalf("term ended with %v (%T), want a *LeaseExpiredError wrapping ErrLeaseExpired", a.Err(), a.Err())
	}
	t.Logf("deadline %v, last seen %v, term ended %v after it", lee.Deadline.Format(time.StampMicro), last.Format(time.StampMicro), time.Since(lee.Deadline))
	if lee.Deadline.IsZero() || !lee.Deadline.Equal(last) {
		t.Errorf("LeaseExpiredError.Deadline = %v, want the last deadline seen, %v", lee.Deadline, last)
	}
	if lee.Error() != tenure.ErrLeaseExpired.Error() {
		t.Errorf("Error() = %q, want ErrLeaseExpired's %q", lee.Error(), tenure.ErrLeaseExpired.Error())
	}
}
