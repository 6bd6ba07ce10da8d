package zkelect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/zkelect"
)

// TestAnchor_StandaloneServerCountsFromItsOwnSync: a standalone server
// touches the session on every packet and has no one to hand over to, so
// a renewal on a connection to it counts from its own sync, the session
// confirms itself every RenewInterval (on an ensemble: from an older sync,
// see TestEnsemble_FollowerCutOffFromTheLeaderServer).
func TestAnchor_StandaloneServerCountsFromItsOwnSync(t *testing.T) {
	b := dial(t, server.Endpoints())
	defer b.Close()
	if r := zkelect.ServerRole(b); r != "single" || zkelect.StrictAnchor(b) {
		t.Fatalf("after Dial: role %s, strict %v; want single, not strict", r, zkelect.StrictAnchor(b))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now()
	// The margin's limit is the ensemble's, here too (a configuration
	// that works on a single server works on an ensemble).
	if _, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 4, DeadlineMargin: ttl / 2}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("OpenSession with DeadlineMargin TTL/2: %v, want ErrInvalidConfig", err)
	}
	s, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 4, DeadlineMargin: ttl * 3 / 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if g := s.Granted(); g.Sent.Before(before) || g.TTL != ttl {
		t.Fatalf("granted %+v: counted from %v before OpenSession was called", g, before.Sub(g.Sent))
	}
	select {
	case r := <-s.Renewals():
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if age := time.Since(r.Sent); age > ttl/8 {
			t.Fatalf("a renewal counts from %v ago", age)
		}
	case <-time.After(ttl):
		t.Fatal("no renewal within the TTL")
	}
}

// TestAnchor_RoleReadAgainAfterAReconnection: each connection reads the
// server's role afresh (a new connection's is unknown, so strict, until
// its read is answered).
func TestAnchor_RoleReadAgainAfterAReconnection(t *testing.T) {
	p, err := faultproxy.New(server.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b := dial(t, []string{p.Addr()})
	defer b.Close()
	if r := zkelect.ServerRole(b); r != "single" {
		t.Fatalf("after Dial: role %s, want single", r)
	}
	id := b.Conn().SessionID()
	p.Cut() // go-zookeeper reconnects at once, to the same session
	waitUntil(t, "the role read on the new connection", func() bool {
		return b.Conn().State() == zk.StateHasSession && zkelect.ServerRole(b) == "single" && zkelect.ReadsOfRole(b) >= 2
	})
	if got := b.Conn().SessionID(); got != id {
		t.Fatalf("session %#x after the cut, want %#x", got, id)
	}
}
