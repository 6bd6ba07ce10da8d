package zkelect_test

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/zkelect"
)

// TestAnchor_StandaloneServerCountsFromItsOwnSync: a standalone server
// expires sessions itself, so once its srvr answer has come, a renewal on a
// connection to it counts from its own sync, and the session confirms
// itself every RenewInterval (on a follower: from an older sync, see
// TestEnsemble_FollowerCutOffFromTheLeaderServer).
func TestAnchor_StandaloneServerCountsFromItsOwnSync(t *testing.T) {
	b := dial(t, server.Endpoints())
	defer b.Close()
	waitUntil(t, "the server's role known", func() bool { return !zkelect.StrictAnchor(b) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now()
	s, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
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
