package zkelect_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

var closeKeys atomic.Int64

// TestClose_BackendClosedUnderALeader: Backend.Close while an elector on it
// still leads (closed before its electors, say by defers in the wrong
// order). Closing the connection ends the ZooKeeper session and deletes
// the leader's node, and the next candidate is elected within
// milliseconds: by then the leader's work must have been cancelled and
// have returned, as on Resign, not run on until its lease deadline
// (TTL − DeadlineMargin after its last renewal).
func TestClose_BackendClosedUnderALeader(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := fmt.Sprintf("/close-%d/leader", closeKeys.Add(1))
	const cleanUp = 100 * time.Millisecond // the work's own clean-up, well under StopTimeout

	b1 := dial(t, server.Endpoints())
	t.Cleanup(b1.Close)
	e1, err := election.New(b1, election.Config{Key: key, Identity: "first", TTL: ttl, StopTimeout: 350 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	elected := make(chan tenure.Term, 1)
	demoted := make(chan error, 1)
	var workEnd atomic.Int64
	runDone := make(chan error, 1)
	go func() {
		runDone <- e1.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				elected <- term
				<-lctx.Done()
				time.Sleep(cleanUp)
				workEnd.Store(time.Now().UnixNano())
			},
			OnDemoted:  func(_ tenure.Term, reason error) { demoted <- reason },
			OnHardStop: func(tenure.Term) { t.Error("OnHardStop ran: the work was not given its StopTimeout") },
		})
	}()
	var term1 tenure.Term
	select {
	case term1 = <-elected:
	case <-time.After(10 * time.Second):
		t.Fatal("the first candidate was not elected")
	}

	b2 := dial(t, server.Endpoints())
	t.Cleanup(b2.Close)
	e2 := newZKElector(t, b2, key, "second")
	got := make(chan tenure.Term, 1)
	var electedAt atomic.Int64
	go func() {
		tn, err := e2.Campaign(ctx)
		electedAt.Store(time.Now().UnixNano())
		if err != nil {
			t.Errorf("second Campaign: %v", err)
		}
		got <- tn
	}()
	waitUntil(t, "the second candidate to queue", func() bool {
		n, err := e2.Position(ctx)
		return err == nil && n == 1
	})

	start := time.Now()
	b1.Close()
	closeTook := time.Since(start)
	var term2 tenure.Term
	select {
	case term2 = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the second candidate was not elected after the first's backend closed")
	}
	end, at := workEnd.Load(), electedAt.Load()
	switch {
	case end == 0:
		t.Fatal("the first leader's work had not returned when the second was elected")
	case at < end:
		t.Fatalf("the second was elected %v before the first leader's work returned", time.Duration(end-at))
	}
	if term2.Token <= term1.Token {
		t.Errorf("second token %d not above the first's %d", term2.Token, term1.Token)
	}
	// The handover waited for the work, not for the lease deadline.
	if d := time.Duration(at - start.UnixNano()); d < cleanUp || d > ttl/2 {
		t.Errorf("second elected %v after Close began; want between the work's clean-up (%v) and TTL/2 (%v)", d, cleanUp, ttl/2)
	}
	select {
	case reason := <-demoted:
		if !errors.Is(reason, tenure.ErrClosed) {
			t.Errorf("OnDemoted reason = %v, want ErrClosed", reason)
		}
	case <-time.After(5 * time.Second):
		t.Error("OnDemoted did not run")
	}
	select {
	case err := <-runDone:
		if !errors.Is(err, tenure.ErrClosed) {
			t.Errorf("Run = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("Run did not return after its backend closed")
	}
	t.Logf("Close took %v; second elected %v after Close began, %v after the first's work returned",
		closeTook, time.Duration(at-start.UnixNano()), time.Duration(at-end))
}

// TestClose_DuringAnEnqueueLeavesNoNode: a session closes while one of its
// Enqueues has a create in flight (held up on the wire). Close lists the
// session's nodes before the create returns; the node it makes must still
// go, not stay under the live ZooKeeper session, where it would block the
// queue for as long as the connection lives.
func TestClose_DuringAnEnqueueLeavesNoNode(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	n := closeKeys.Add(1)
	key := fmt.Sprintf("/close-%d/leader", n)
	admin := rawConn(t, "", "")
	for _, p := range []string{fmt.Sprintf("/close-%d", n), key} {
		if _, err := admin.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	p, _, s := sessionBehindProxy(t, ctx)
	p.Delay(300 * time.Millisecond)
	enq := enqueue(ctx, s, key)
	time.Sleep(100 * time.Millisecond) // the create is on the wire
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	p.Delay(0)
	r := <-enq
	if !errors.Is(r.err, tenure.ErrClosed) {
		t.Errorf("Enqueue across Close = %+v, %v; want ErrClosed", r.t, r.err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		children, _, err := admin.Children(key)
		if err != nil {
			t.Fatal(err)
		}
		if len(children) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still has %v 5 s after the Enqueue returned, with the Backend open", key, children)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClose_WithSessionsLeftOpenReturnsAfterTheTTL: sessions opened on a
// Backend and never closed (no elector owns them) hold up its Close for
// at most the TTL, however many there are.
func TestClose_WithSessionsLeftOpenReturnsAfterTheTTL(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := dial(t, server.Endpoints())
	for range 3 {
		if _, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3, Now: time.Now}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		b.Close()
		close(done)
	}()
	// One TTL, plus room for a loaded machine; waiting once per session
	// would take three.
	bound := ttl + ttl/2
	select {
	case <-done:
		t.Logf("Close with 3 sessions left open returned after %v (TTL %v)", time.Since(start), ttl)
	case <-time.After(bound):
		t.Fatalf("Close with 3 sessions left open had not returned after %v (TTL %v)", bound, ttl)
	}
}

// TestClose_RequestsAfterCloseAreErrClosed: once the Backend is closed its
// requests fail with ErrClosed, which no caller retries, not with
// ErrUnavailable, on which Run, Observe and OpenSession's renewal retry
// every 50 ms for as long as their ctx lives.
func TestClose_RequestsAfterCloseAreErrClosed(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := dial(t, server.Endpoints())
	key := fmt.Sprintf("/close-%d/after", closeKeys.Add(1))
	if _, err := b.Leader(ctx, key); err != nil {
		t.Fatal(err)
	}
	b.Close()
	begun := time.Now()
	_, err := b.Leader(ctx, key)
	if !errors.Is(err, tenure.ErrClosed) || errors.Is(err, tenure.ErrUnavailable) {
		t.Fatalf("Leader after Close: %v, want ErrClosed", err)
	}
	if d := time.Since(begun); d > time.Second {
		t.Fatalf("Leader after Close took %v", d)
	}
}
