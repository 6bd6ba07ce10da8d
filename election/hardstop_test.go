package election_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// TestRun_OnHardStopMayCloseOrResign: a hard stop that steps down (Close
// or Resign from OnHardStop, while the work has not returned yet) returns
// once the work has, and Run returns; before, both waited for each other
// for good: the entry was released only after OnHardStop had returned.
func TestRun_OnHardStopMayCloseOrResign(t *testing.T) {
	for _, how := range []string{"Close", "Resign"} {
		t.Run(how, func(t *testing.T) {
			srv, key, ctx := setup(t)
			e, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
			b, _ := newElector(t, srv, key, "b", time.Second)
			release := make(chan struct{})
			elected := make(chan struct{})
			stepDown := make(chan error, 1)
			runCtx, stopRun := context.WithCancel(ctx)
			defer stopRun()
			runDone := make(chan error, 1)
			go func() {
				runDone <- e.Run(runCtx, tenure.Callbacks{
					OnElected: func(ctx context.Context, _ tenure.Term) {
						close(elected)
						<-ctx.Done()
						<-release // past StopTimeout
					},
					OnHardStop: func(tenure.Term) {
						go func() { time.Sleep(50 * time.Millisecond); close(release) }()
						cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						if how == "Close" {
							stepDown <- e.Close(cctx)
						} else {
							stepDown <- e.Resign(cctx)
							stopRun()
						}
					},
				})
			}()
			<-elected
			bElected := make(chan error, 1)
			go func() { _, err := b.Campaign(ctx); bElected <- err }()
			go func() { _ = e.Resign(ctx) }() // ends the term; the work ignores it
			select {
			case err := <-stepDown:
				if err != nil {
					t.Fatalf("%s from OnHardStop: %v", how, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s from OnHardStop still blocked 5 s after the work returned", how)
			}
			select {
			case err := <-runDone:
				if how == "Close" && !errors.Is(err, tenure.ErrClosed) || how == "Resign" && !errors.Is(err, tenure.ErrCanceled) {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Run still running 5 s after the hard stop stepped down")
			}
			select {
			case err := <-bElected:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("b not elected 5 s after a stepped down")
			}
		})
	}
}

// TestRun_BrokenWatchResignsTheTerm: a loss watch that fails without
// proving the term lost (a backend's transient error) ends the term as a
// resignation: OnDemoted gets ErrResigned (wrapping the error) and Run
// deletes the entry. Before, the reason was the bare transient error and
// Run left the entry at the head of the queue when its ctx ended then.
func TestRun_BrokenWatchResignsTheTerm(t *testing.T) {
	srv, key, ctx := setup(t)
	var broke chan struct{}
	fb := faultyBackend{Client: srv.Client(), mu: &sync.Mutex{}, breakWatch: &broke, failDequeue: &atomic.Int32{}}
	fb.mendWatches()
	a, err := election.New(fb, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	demoted := make(chan error, 1)
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(runCtx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				fb.breakWatches()
				<-ctx.Done()
			},
			OnDemoted: func(_ tenure.Term, reason error) {
				stopRun() // the program stops right after
				demoted <- reason
			},
		})
	}()
	reason := <-demoted
	if !errors.Is(reason, tenure.ErrResigned) || !errors.Is(reason, errWatchBroke) {
		t.Errorf("OnDemoted reason %v, want ErrResigned wrapping the watch's error", reason)
	}
	if err := <-runDone; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("Run: %v", err)
	}
	if n := srv.Entries(key); n != 0 {
		t.Fatalf("%d entries after Run returned, want 0: the entry blocks the queue while the session lives", n)
	}
}

// TestRun_OnLeaderEndsWithTheStateRunLeaves: when Run's ctx ends while it
// leads, Run resigns and returns; its last OnLeader call reports who leads
// after that (the candidate that was waiting), not this elector. Before,
// the observer stopped with the ctx, before the resignation, and the last
// call named this elector.
func TestRun_OnLeaderEndsWithTheStateRunLeaves(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second)
	b, _ := newElector(t, srv, key, "b", time.Second)
	var (
		mu   sync.Mutex
		last tenure.Leader
	)
	runCtx, stopRun := context.WithCancel(ctx)
	elected := make(chan struct{})
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(runCtx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) { close(elected); <-ctx.Done() },
			OnLeader: func(l tenure.Leader) {
				mu.Lock()
				last = l
				mu.Unlock()
			},
		})
	}()
	<-elected
	bTerm := make(chan tenure.Term, 1)
	go func() {
		term, err := b.Campaign(ctx)
		if err != nil {
			t.Error(err)
		}
		bTerm <- term
	}()
	electiontest.WaitFor(t, 5*time.Second, "b queued and a reported as leader", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return srv.Entries(key) == 2 && last.Term.Identity == "a"
	})
	stopRun()
	if err := <-runDone; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("Run: %v", err)
	}
	term := <-bTerm
	mu.Lock()
	defer mu.Unlock()
	if last.Vacant || last.Term.Identity != "b" || last.Term.Token != term.Token {
		t.Fatalf("OnLeader's last call reported %v after Run returned, want b's term %v", last, term)
	}
}

// TestRun_ReleaseAskedBeforeTheHardStopWaitsForIt: a Resign asked before
// OnHardStop began (a shutdown that cancelled the term while the work
// ignored it) releases leadership only once OnHardStop has returned, as
// it always did: OnHardStop may still be stopping what the work left.
// 9f15620 released it as soon as OnElected returned.
func TestRun_ReleaseAskedBeforeTheHardStopWaitsForIt(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
	b, _ := newElector(t, srv, key, "b", time.Second)
	release := make(chan struct{})
	elected := make(chan struct{})
	var hardStopEnded atomic.Int64
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(runCtx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				close(elected)
				<-ctx.Done()
				<-release
			},
			OnHardStop: func(tenure.Term) {
				close(release) // the work returns at once...
				time.Sleep(300 * time.Millisecond)
				hardStopEnded.Store(time.Now().UnixNano()) // ...while this goes on
			},
		})
	}()
	<-elected
	bElected := make(chan time.Time, 1)
	go func() {
		if _, err := b.Campaign(ctx); err != nil {
			t.Error(err)
		}
		bElected <- time.Now()
	}()
	electiontest.WaitFor(t, 5*time.Second, "b queued", func() bool { return srv.Entries(key) == 2 })
	resigned := make(chan error, 1)
	go func() { resigned <- a.Resign(ctx) }()
	var at time.Time
	select {
	case at = <-bElected:
	case <-time.After(5 * time.Second):
		t.Fatal("b not elected 5 s after a's Resign")
	}
	if err := <-resigned; err != nil {
		t.Fatal(err)
	}
	end := hardStopEnded.Load()
	if end == 0 || at.UnixNano() < end {
		t.Fatalf("b elected %v before OnHardStop returned (0: it had not)", time.Duration(end-at.UnixNano()))
	}
	stopRun()
	<-runDone
}

// TestResign_EndsWithItsContextWhileTheWorkStops: Resign whose ctx ends
// while Run's elected work ignores its cancelled context (and OnHardStop
// keeps the process alive) returns ErrCanceled with the ctx's error; the
// term has ended, and the entry is deleted once the work returns. Before,
// Resign waited for the work whatever its ctx.
func TestResign_EndsWithItsContextWhileTheWorkStops(t *testing.T) {
	srv, key, ctx := setup(t)
	e, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
	b, _ := newElector(t, srv, key, "b", time.Second)
	release := make(chan struct{})
	elected := make(chan struct{})
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() {
		runDone <- e.Run(runCtx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				close(elected)
				<-release // ignores ctx
			},
			OnHardStop: func(tenure.Term) {}, // keeps the process
		})
	}()
	<-elected
	bElected := make(chan time.Time, 1)
	go func() {
		if _, err := b.Campaign(ctx); err == nil {
			bElected <- time.Now()
		}
	}()
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	resigned := make(chan error, 1)
	go func() { resigned <- e.Resign(rctx) }()
	var err error
	select {
	case err = <-resigned:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("Resign with a 300 ms ctx still blocked 5 s later, waiting for the work")
	}
	took := time.Since(began)
	if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Resign with a 300 ms ctx, the work not returning: %v after %v, want ErrCanceled and DeadlineExceeded", err, took)
	}
	if took > 2*time.Second {
		t.Fatalf("Resign returned %v after its 300 ms ctx ended", took)
	}
	if e.IsLeader() {
		t.Fatal("still leader after Resign")
	}
	select {
	case <-bElected:
		t.Fatal("b elected while a's work still runs")
	case <-time.After(200 * time.Millisecond):
	}
	stopRun()
	returned := time.Now()
	close(release)
	select {
	case at := <-bElected:
		if at.Before(returned) {
			t.Fatalf("b elected %v before a's work returned", returned.Sub(at))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b not elected 5 s after a's work returned")
	}
	select {
	case <-runDone:
	case <-time.After(5 * time.Second):
		t.Fatal("Run still running 5 s after its work returned")
	}
}

// TestClose_FromOnHardStopBehindAnotherClose: a Close from outside waits
// for the elected work, which ignores its context; the hard stop begins
// and OnHardStop calls Close too. Both return once the work has. Before,
// the first Close waited for the term's end that only Run marks, and Run
// waited for OnHardStop, which waited for the first Close: all three
// forever.
func TestClose_FromOnHardStopBehindAnotherClose(t *testing.T) {
	srv, key, ctx := setup(t)
	e, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
	release := make(chan struct{})
	elected := make(chan struct{})
	inner := make(chan error, 1)
	runDone := make(chan error, 1)
	go func() {
		runDone <- e.Run(ctx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				close(elected)
				<-release // ignores ctx
			},
			OnHardStop: func(tenure.Term) {
				go func() { time.Sleep(50 * time.Millisecond); close(release) }()
				inner <- e.Close(context.Background())
			},
		})
	}()
	<-elected
	outer := make(chan error, 1)
	go func() { outer <- e.Close(context.Background()) }()
	awaitAll(t, map[string]chan error{"the outside Close": outer, "Close from OnHardStop": inner, "Run": runDone})
}

// awaitAll fails the test unless every channel delivers within 5 s.
func awaitAll(t *testing.T, chans map[string]chan error) {
	t.Helper()
	for name, ch := range chans {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still blocked 5 s after the work returned", name)
		}
	}
}

// TestClose_FromOnHardStopEndsWithItsContext: OnHardStop calls Close with
// a short ctx and stops the work only once Close has returned (it kills
// what the work runs, say). Close returns ErrCanceled at its deadline; the
// session ends once the work has returned, and another candidate leads.
// Before, Close waited for the work, which waited for OnHardStop, which
// waited for Close.
func TestClose_FromOnHardStopEndsWithItsContext(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second) // StopTimeout 100 ms
	b, _ := newElector(t, srv, key, "b", time.Second)
	release := make(chan struct{})
	elected := make(chan struct{})
	closed := make(chan error, 1)
	runDone := make(chan error, 1)
	go func() {
		runDone <- a.Run(ctx, tenure.Callbacks{
			OnElected: func(ctx context.Context, _ tenure.Term) {
				close(elected)
				<-ctx.Done()
				<-release
			},
			OnHardStop: func(tenure.Term) {
				cctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				err := a.Close(cctx)
				closed <- err
				close(release) // stops the work only now
			},
		})
	}()
	<-elected
	bElected := make(chan error, 1)
	go func() { _, err := b.Campaign(ctx); bElected <- err }()
	electiontest.WaitFor(t, 5*time.Second, "b queued", func() bool { return srv.Entries(key) == 2 })
	go func() { _ = a.Resign(ctx) }() // ends the term; the work ignores it
	select {
	case err := <-closed:
		if !errors.Is(err, tenure.ErrCanceled) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close from OnHardStop with a 300 ms ctx: %v, want ErrCanceled and DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("Close from OnHardStop still blocked 5 s later, waiting for the work it was to stop")
	}
	awaitAll(t, map[string]chan error{"Run": runDone, "b's campaign": bElected})
}

// TestClose_CancelledWithoutRunEndsTheSessionFirst: Close with a ctx that
// has ended, on a term won by Campaign (no work to wait for), still ends
// the session (on its own bounded ctx) before it returns, so that no
// entry outlives it. d045bd9 went to the background whenever the
// release's delete failed on ctx, and the entry stayed.
func TestClose_CancelledWithoutRunEndsTheSessionFirst(t *testing.T) {
	srv, key, ctx := setup(t)
	a, _ := newElector(t, srv, key, "a", time.Second)
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	_ = a.Close(done)
	if n := srv.Entries(key); n != 0 {
		t.Fatalf("%d entries left when Close (its ctx ended) returned", n)
	}
}
