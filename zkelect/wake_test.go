package zkelect_test

import (
	"context"
	"errors"
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
