package chaos

import (
	"testing"
	"time"
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
