package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestRewind_DivergedFormerPrimaryIsNeverPromotedOverNewerHistory: the
// primary's PostgreSQL dies with a commit its standby never received (the
// test stopped its WAL sender first). The standby is promoted and commits
// a row of its own. The former primary's data has diverged: it must
// rewind onto the new primary before it streams, or stands, again. The new
// primary then crashes at once. For as long as it is down, no member may
// be promoted without its row: the former primary, unless it has rewound
// meanwhile, holds the diverged commit instead of it. Once the crashed
// member is back, a primary has the row, and both members have it and not
// the diverged commit. In the second run the former primary's manager
// restarts just after the crash: its control file no longer says it was
// a primary's (it has run as a standby since), and the manager must still
// know that it needs the rewind.
func TestRewind_DivergedFormerPrimaryIsNeverPromotedOverNewerHistory(t *testing.T) {
	t.Run("kept running", func(t *testing.T) { testDivergedFormerPrimary(t, false) })
	t.Run("manager restarted", func(t *testing.T) { testDivergedFormerPrimary(t, true) })
}

func testDivergedFormerPrimary(t *testing.T, restart bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, _ := testCluster(t, 2)
	p1, other := twoMembers(ctx, t, c)
	conn, err := c.connect(ctx, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The test cluster commits asynchronously (synchronous_commit off):
	// this test's commits must survive the crashes it makes.
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	base, err := Write(ctx, conn, p1.Term, "base")
	if err != nil {
		t.Fatal(err)
	}
	readRow(ctx, t, c, other, base, p1.Term)

	// The divergence: a commit the standby never receives, then the
	// primary's PostgreSQL dies (not its manager).
	var sender int
	if err := conn.QueryRow(ctx, `SELECT pid FROM pg_stat_replication`).Scan(&sender); err != nil {
		t.Fatalf("the primary's WAL sender: %v", err)
	}
	if err := syscall.Kill(sender, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	diverged, err := Write(ctx, conn, p1.Term, "diverged")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pm := c.postmasterPID(p1.Name)
	if pm <= 0 {
		t.Fatalf("no postmaster pid for %s", p1.Name)
	}
	_ = syscall.Kill(-pm, syscall.SIGKILL)
	_ = syscall.Kill(sender, syscall.SIGKILL)

	p2, err := c.waitPrimary(ctx, 60*time.Second, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := rowCount(ctx, c, p2.Name, diverged); err != nil || n != 0 {
		t.Fatalf("setup: the diverged commit %d on the new primary %s: count %d, %v; want 0", diverged, p2.Name, n, err)
	}
	conn, err = c.connect(ctx, p2.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	newer, err := Write(ctx, conn, p2.Term, "newer")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Replication is asynchronous: a standby that streams from the new
	// primary may still miss its last commit when it crashes, which is not
	// what this test is about. So when the former primary already streams
	// from it (rewound in the meantime), the crash waits for the row.
	streamed := streaming(ctx, c, p1.Name)
	if streamed {
		readRow(ctx, t, c, p1.Name, newer, p2.Term)
	}
	crashed := time.Now()
	c.kill(p2.Name)
	if restart {
		c.stop(p1.Name, 20*time.Second)
		if err := c.start(p1.Name); err != nil {
			t.Fatal(err)
		}
	}

	// The new primary's key expires within TTL + etcd's expiry check of
	// the crash; then, for as long again and more, nobody may be promoted
	// without the row.
	watch := testTTL + etcdExpiry + 10*time.Second
	promoted := ""
	for time.Since(crashed) < watch {
		for _, st := range c.primaries(ctx) {
			n, err := rowCount(ctx, c, st.Name, newer)
			if err != nil {
				continue // not answering: cannot accept writes either
			}
			d, _ := rowCount(ctx, c, st.Name, diverged)
			if n != 1 {
				t.Fatalf("%s is primary under term %d without the commit %d of term %d (it holds the diverged commit %d of term %d: %v)",
					st.Name, st.Term, newer, p2.Term, diverged, p1.Term, d == 1)
			}
			promoted = fmt.Sprintf("%s under term %d", st.Name, st.Term)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("former primary streaming from the new one before its crash: %v; promoted in the %v after the crash: %q", streamed, watch, promoted)

	// The crashed member comes back: a primary with the row, and the other
	// member streaming from it, both without the diverged commit.
	if err := c.start(p2.Name); err != nil {
		t.Fatal(err)
	}
	p3, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	replica := p2.Name
	if p3.Name == p2.Name {
		replica = p1.Name
	}
	if err := c.waitReplica(ctx, 90*time.Second, replica); err != nil {
		t.Fatal(err)
	}
	readRow(ctx, t, c, replica, newer, p2.Term)
	for _, n := range c.names() {
		if got, err := rowCount(ctx, c, n, diverged); err != nil || got != 0 {
			t.Errorf("the diverged commit %d on %s: count %d, %v; want 0", diverged, n, got, err)
		}
	}
	for _, e := range c.eventLog() {
		if e.Node == p1.Name && (e.Event == "rewind" || e.Event == "restart") {
			t.Logf("%s: %s %s", e.Node, e.Event, e.At.Format("15:04:05.000"))
		}
	}
}

// rowCount counts the rows with id on member name's PostgreSQL.
func rowCount(ctx context.Context, c *localCluster, name string, id int64) (int, error) {
	conn, err := c.connect(ctx, name)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM rows WHERE id = $1`, id).Scan(&n)
	return n, err
}

// streaming reports whether member name's PostgreSQL is a standby that
// streams WAL.
func streaming(ctx context.Context, c *localCluster, name string) bool {
	conn, err := c.connect(ctx, name)
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var n int
	return conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'`).Scan(&n) == nil && n == 1
}
