package etcdembed

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCluster_LeaderStopRestart: a three-member cluster elects a new raft
// leader when its leader is stopped, keeps serving writes, takes the member
// back, and survives a full restart with its data.
func TestCluster_LeaderStopRestart(t *testing.T) {
	c, err := StartCluster(t.TempDir(), 3, 50, 500)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(v string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := cli.Put(ctx, "k", v); err != nil {
			t.Fatalf("put %s: %v", v, err)
		}
	}
	put("1")
	old, err := c.WaitLeader(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Stop(old); err != nil {
		t.Fatal(err)
	}
	if c.Running(old) {
		t.Fatal("stopped member still running")
	}
	now, err := c.WaitLeader(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if now == old {
		t.Fatalf("leader %d is the stopped member", now)
	}
	t.Logf("raft leader %d stopped; member %d leads %v later", old, now, time.Since(start).Round(time.Millisecond))
	put("2")
	if err := c.Restart(old); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := c.RestartAll(); err != nil {
		t.Fatal(err)
	}
	t.Logf("full restart took %v", time.Since(start).Round(time.Millisecond))
	if _, err := c.WaitLeader(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "2" {
		t.Fatalf("after the restart k = %v, want 2", r.Kvs)
	}
}
