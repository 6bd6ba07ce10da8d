package main

import (
	"context"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestCampaign_WithdrawnWhileItsPostgreSQLIsDown: a member stands for
// election only while its PostgreSQL runs as a standby. When that
// PostgreSQL dies, the member leaves the queue before it repairs it (a
// rewind, a copy or a recovery may take long), and joins again once it
// runs. Before, it stayed queued throughout: elected meanwhile, it held
// the key with no primary until the repair ended.
func TestCampaign_WithdrawnWhileItsPostgreSQLIsDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, _ := testCluster(t, 2)
	_, standby := twoMembers(ctx, t, c)
	cli := dcsClient(t, c)
	// entry returns the create revision of the standby's entry in the
	// leader key's queue, 0 when it has none.
	entry := func() int64 {
		r, err := cli.Get(ctx, c.cfgs[0].LeaderKey()+"/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			if string(kv.Value) == standby {
				return kv.CreateRevision
			}
		}
		return 0
	}
	var queued int64
	if err := waitFor(ctx, 30*time.Second, standby+" queued", func(context.Context) bool { queued = entry(); return queued != 0 }); err != nil {
		t.Fatal(err)
	}
	pm := c.postmasterPID(standby)
	if pm <= 0 {
		t.Fatalf("no postmaster pid for %s", standby)
	}
	killed := time.Now()
	_ = syscall.Kill(-pm, syscall.SIGKILL)
	var withdrawn time.Time
	if err := waitFor(ctx, 10*time.Second, standby+"'s entry withdrawn", func(context.Context) bool { return entry() != queued }); err != nil {
		t.Fatalf("%s kept its place in the queue (entry of revision %d) while its PostgreSQL was down: %v", standby, queued, err)
	}
	withdrawn = time.Now()
	if err := waitFor(ctx, 60*time.Second, standby+" queued again", func(context.Context) bool { return entry() != 0 }); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s's PostgreSQL killed: its entry withdrawn %v later, queued again %v later", standby, withdrawn.Sub(killed).Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if err := c.waitReplica(ctx, 60*time.Second, standby); err != nil {
		t.Fatal(err)
	}
	// It replays again: a row written now reaches it. Before, its crash
	// recovery ran outside standby mode (in pg_rewind), wrote WAL the
	// primary never had, and replay stopped for good at the first
	// segment streamed ("incorrect prev-link"), while /replica said 200.
	primary, err := c.waitPrimary(ctx, 30*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.connect(ctx, primary.Name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, conn, primary.Term, "after the standby's crash")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	readRow(ctx, t, c, standby, id, primary.Term)
}

// twoMembers starts the two members of c and waits for one to be primary
// and the other to stream from it; it returns the primary's status and
// the standby's name.
func twoMembers(ctx context.Context, t *testing.T, c *localCluster) (primary Status, standby string) {
	t.Helper()
	startAll(t, c)
	primary, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names() {
		if n != primary.Name {
			standby = n
		}
	}
	if err := c.waitReplica(ctx, 90*time.Second, standby); err != nil {
		t.Fatal(err)
	}
	return primary, standby
}
