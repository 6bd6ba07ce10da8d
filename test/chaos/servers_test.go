package chaos

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure/election"
)

// TestEtcdLeaderChanges_SeenWhenTheRaftLeaderIsKilled: the count the
// harness reads to extend the failover bound (a raft leader change renews
// every lease) grows when the raft leader is killed.
func TestEtcdLeaderChanges_SeenWhenTheRaftLeaderIsKilled(t *testing.T) {
	s := env.servers["etcd"]
	before := s.LeaderChanges()
	if before == 0 {
		t.Fatal("no leader change counted at all: the cluster's first election must count")
	}
	restore, err := s.KillLeader()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.LeaderChanges() == before && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	after := s.LeaderChanges()
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	t.Logf("leader changes seen: %v before the kill, %v after", before, after)
	if after <= before {
		t.Fatalf("leader changes seen stayed at %v after the raft leader was killed", before)
	}
}

// TestHolder_IsTheElectedTerm: the server-side holder the harness checks a
// kept term against (observe) is the elected term's token while it leads,
// and not once it has resigned.
func TestHolder_IsTheElectedTerm(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			s := env.servers[be.name]
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b, _, closeB, err := dialCandidate(ctx, be.name, s.Endpoints(), ttl, zap.NewNop())
			if err != nil {
				t.Fatal(err)
			}
			defer closeB()
			key := fmt.Sprintf("/chaos/%s/holder", nextRunID(be.name, "holder"))
			e, err := election.New(b, election.Config{Key: key, Identity: "h", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(context.Background())
			term, err := e.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h, err := s.Holder(key); err != nil || h != term.Token {
				t.Fatalf("Holder while term %d leads = %d, %v", term.Token, h, err)
			}
			if err := e.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			if h, err := s.Holder(key); err != nil || h != 0 {
				t.Fatalf("Holder after the resignation = %d, %v; want 0", h, err)
			}
		})
	}
}

// TestBounded_GivesUpOnACallThatDoesNotReturn: the checker's ZooKeeper
// reads give up after their bound instead of waiting on a client that has
// no server, and pass an answer through when one comes.
func TestBounded_GivesUpOnACallThatDoesNotReturn(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	_, err := bounded(100*time.Millisecond, func() (int, error) {
		<-release
		return 1, nil
	})
	if err == nil {
		t.Fatal("bounded returned no error for a call that never answered")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("bounded gave up after %v, want about 100ms", d)
	}
	v, err := bounded(time.Minute, func() (int, error) { return 7, errors.New("boom") })
	if v != 7 || err == nil || err.Error() != "boom" {
		t.Fatalf("bounded(answering call) = %d, %v; want 7, boom", v, err)
	}
}
