package zkelect_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// campaignAsync starts e's campaign and returns where its outcome arrives.
func campaignAsync(ctx context.Context, e *election.Elector) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := e.Campaign(ctx)
		done <- err
	}()
	return done
}

// TestWake_OwnNodeDeletedWithPredecessorIsNotElected: when one transaction
// (a multi) deletes the holder's node and then the standby's, the standby
// is woken by its predecessor's delete while its own node's event may not
// have been read yet; it must not lead. This is why a wake-up reads the
// queue even when the last read showed the predecessor alone ahead: a
// variant that skipped that read, and only checked its own node's watch
// without blocking, led with no node here within three rounds.
func TestWake_OwnNodeDeletedWithPredecessorIsNotElected(t *testing.T) {
	raw := rawConn(t, "", "")
	for round := range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		key := electiontest.Key(t) + "-" + string(rune('a'+round))
		a := newZKElector(t, dialWith(t), key, "a")
		b := newZKElector(t, dialWith(t), key, "b")
		if _, err := a.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		bDone := campaignAsync(ctx, b)
		var nodes []string
		waitUntil(t, "b queued", func() bool {
			c, _, err := raw.Children(key)
			nodes = c
			return err == nil && len(c) == 2
		})
		time.Sleep(100 * time.Millisecond) // b sets its watches
		var ops []any
		for _, n := range nodes { // a's node first, then b's
			if d, _, err := raw.Get(path.Join(key, n)); err == nil && string(d) == "a" {
				ops = append([]any{&zk.DeleteRequest{Path: path.Join(key, n), Version: -1}}, ops...)
			} else {
				ops = append(ops, &zk.DeleteRequest{Path: path.Join(key, n), Version: -1})
			}
		}
		if _, err := raw.Multi(ops...); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-bDone:
			if !errors.Is(err, tenure.ErrOwnershipLost) {
				t.Fatalf("round %d: b's campaign = %v, want ErrOwnershipLost (its node is gone)", round, err)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: b's campaign did not end", round)
		}
		if b.IsLeader() {
			t.Fatalf("round %d: b leads without a node", round)
		}
		cancel()
	}
}

// wchc returns the server's watches by session (the four-letter command).
func wchc(t *testing.T) string {
	t.Helper()
	c, err := net.Dial("tcp", server.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "wchc"); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// TestWaitHead_VanishedPredecessorLeavesNoWatch: a predecessor that left
// between the queue read and its watch must leave no watch behind. An
// exists watch on a missing node stays registered, on the client and the
// server, until that path is created again, and a contender's name never
// is: each such watch would live for the connection's life and be sent
// again on every reconnection.
func TestWaitHead_VanishedPredecessorLeavesNoWatch(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := secKey(t)
	raw := rawConn(t, "", "")
	p := ""
	for _, part := range strings.Split(key[1:], "/") {
		p += "/" + part
		if _, err := raw.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	pred, err := raw.Create(key+"/_c_00000000-0000-4000-8000-000000000001-lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	b := dialWith(t)
	s, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	tk, err := s.Enqueue(ctx, key, "w") // its first look at the queue shows pred ahead
	if err != nil {
		t.Fatal(err)
	}
	if err := raw.Delete(pred, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WaitHead(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if err := s.Dequeue(ctx, tk); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if out := wchc(t); strings.Contains(out, pred) {
		t.Fatalf("a watch on the vanished predecessor %s is still registered:\n%s", pred, out)
	}
}

// TestWatchLoss_TheLeaderWatchesItsNodeTheWaiterDoesNot: a waiter sets no
// watch on its own node (it sees the node at each wake-up's queue read);
// the leader's loss watch is set lossWatchDelay (10 ms) into its term. A
// leader whose node is deleted, at once or later in its term, is demoted
// with ErrOwnershipLost within a round trip or two of that watch: the
// renewals (syncs) never look at the node, so nothing else would tell.
func TestWatchLoss_TheLeaderWatchesItsNodeTheWaiterDoesNot(t *testing.T) {
	raw := rawConn(t, "", "")
	ctx := ctxT(t, 60*time.Second)
	key := electiontest.Key(t)
	a := newZKElector(t, dialWith(t), key, "a")
	b := newZKElector(t, dialWith(t), key, "b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bDone := campaignAsync(ctx, b)
	var bNode string
	waitUntil(t, "b queued", func() bool {
		c, _, err := raw.Children(key)
		for _, n := range c {
			if p := path.Join(key, n); p != ta.Entry {
				bNode = p
			}
		}
		return err == nil && len(c) == 2
	})
	waitUntil(t, "b's watch on a's node", func() bool { return strings.Contains(wchc(t), ta.Entry) })
	time.Sleep(100 * time.Millisecond) // a leads past the delay; b has set all it sets
	watches := wchc(t)
	if !strings.Contains(watches, ta.Entry) {
		t.Fatalf("no watch on the leader's node %s:\n%s", ta.Entry, watches)
	}
	if strings.Contains(watches, bNode) {
		t.Fatalf("the waiter watches its own node %s:\n%s", bNode, watches)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the new leader's watch on its node", func() bool { return strings.Contains(wchc(t), bNode) })
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	for _, after := range []time.Duration{0, 5 * time.Millisecond, 200 * time.Millisecond} {
		e := newZKElector(t, dialWith(t), key, fmt.Sprint("c", after))
		elected := make(chan tenure.Term, 1)
		demoted := make(chan error, 1)
		runCtx, stop := context.WithCancel(ctx)
		runDone := make(chan error, 1)
		go func() {
			runDone <- e.Run(runCtx, tenure.Callbacks{
				OnElected: func(lctx context.Context, term tenure.Term) {
					select {
					case elected <- term:
					default:
					}
					<-lctx.Done()
				},
				OnDemoted: func(_ tenure.Term, reason error) {
					select {
					case demoted <- reason:
					default:
					}
				},
			})
		}()
		var term tenure.Term
		select {
		case term = <-elected:
		case <-ctx.Done():
			t.Fatal("not elected")
		}
		time.Sleep(after)
		deleted := time.Now()
		if err := raw.Delete(term.Entry, -1); err != nil {
			t.Fatal(err)
		}
		select {
		case reason := <-demoted:
			took := time.Since(deleted)
			if !errors.Is(reason, tenure.ErrOwnershipLost) {
				t.Fatalf("node deleted %v into the term: demoted with %v, want ErrOwnershipLost", after, reason)
			}
			// The renewals (syncs) never look at the node, so only the
			// watch can have told; the bound only keeps a slow machine
			// from failing the test.
			if took > 2*time.Second {
				t.Fatalf("node deleted %v into the term: demoted %v later", after, took)
			}
			t.Logf("node deleted %v into the term: demoted %v later", after, took.Round(time.Microsecond))
		case <-time.After(5 * time.Second):
			t.Fatalf("node deleted %v into the term: still leading 5 s later", after)
		}
		stop()
		if err := <-runDone; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
	}
}

// TestWaitHead_WaiterWhoseNodeIsDeletedIsPassedOver: a waiter (w) does not
// watch its own node. When its node is deleted while the leader (a) holds,
// the candidate behind it (x) now waits for a, and w learns of the loss by
// the time a resigns at the latest: x leads, and w's campaign fails with
// ErrOwnershipLost; w never leads without its node.
func TestWaitHead_WaiterWhoseNodeIsDeletedIsPassedOver(t *testing.T) {
	raw := rawConn(t, "", "")
	ctx := ctxT(t, 60*time.Second)
	key := electiontest.Key(t)
	a := newZKElector(t, dialWith(t), key, "a")
	w := newZKElector(t, dialWith(t), key, "w")
	x := newZKElector(t, dialWith(t), key, "x")
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	nodeOf := func(id string) string {
		c, _, err := raw.Children(key)
		if err != nil {
			return ""
		}
		for _, n := range c {
			if d, _, err := raw.Get(path.Join(key, n)); err == nil && string(d) == id {
				return path.Join(key, n)
			}
		}
		return ""
	}
	wDone := campaignAsync(ctx, w)
	waitUntil(t, "w queued", func() bool { return nodeOf("w") != "" })
	xDone := campaignAsync(ctx, x)
	waitUntil(t, "x queued", func() bool { return nodeOf("x") != "" })
	wNode := nodeOf("w")
	waitUntil(t, "x's watch on w's node", func() bool { return strings.Contains(wchc(t), wNode) })
	if err := raw.Delete(wNode, -1); err != nil {
		t.Fatal(err)
	}
	// w may learn of its loss now or later (today: later), but never
	// leads; x waits for a.
	var wErr error
	wEnded := false
	select {
	case wErr = <-wDone:
		wEnded = true
	case err := <-xDone:
		t.Fatalf("x's campaign ended while a still leads: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-xDone:
		if err != nil {
			t.Fatalf("x's campaign: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("x was not elected after a resigned")
	}
	if !wEnded {
		select {
		case wErr = <-wDone:
		case <-ctx.Done():
			t.Fatal("w's campaign did not end after a resigned")
		}
	}
	if !errors.Is(wErr, tenure.ErrOwnershipLost) {
		t.Fatalf("w's campaign = %v, want ErrOwnershipLost", wErr)
	}
	if w.IsLeader() || !x.IsLeader() {
		t.Fatalf("after a resigned: w leads %v, x leads %v; want x alone", w.IsLeader(), x.IsLeader())
	}
}

// TestWatchLoss_NodeDataChangedDemotes: someone sets data on the leader's
// node (an operator, another client). zkfence refuses the leader's writes
// from then on (the node is no longer at version 0), so the elector must
// demote it and let the next candidate lead. Before, the loss watch only
// set itself again: the leader kept its term, unable to write, for good.
func TestWatchLoss_NodeDataChangedDemotes(t *testing.T) {
	raw := rawConn(t, "", "")
	ctx := ctxT(t, 60*time.Second)
	key := electiontest.Key(t)
	a := newZKElector(t, dialWith(t), key, "a")
	b := newZKElector(t, dialWith(t), key, "b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bDone := campaignAsync(ctx, b)
	waitUntil(t, "a's loss watch", func() bool { return strings.Contains(wchc(t), ta.Entry) })
	changed := time.Now()
	if _, err := raw.Set(ta.Entry, []byte("touched"), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the leader whose node was changed still leads 5 s later")
	}
	took := time.Since(changed)
	if !errors.Is(a.Err(), tenure.ErrOwnershipLost) {
		t.Fatalf("demoted with %v, want ErrOwnershipLost", a.Err())
	}
	if err := <-bDone; err != nil {
		t.Fatalf("the next candidate: %v", err)
	}
	t.Logf("node data changed: leader demoted %v later, and the next candidate leads", took.Round(time.Microsecond))
}
