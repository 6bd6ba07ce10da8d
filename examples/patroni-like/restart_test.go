package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestart_OneMemberClusterComesBack: the configuration accepts a
// one-member cluster. Its only member, a former primary, restarted cleanly,
// must not wait for another primary to rewind onto (none can exist): it was
// promoted last, so its data has not diverged from anyone's, and it leads
// again with the row it wrote.
func TestRestart_OneMemberClusterComesBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, dir := testCluster(t, 1)
	if err := c.start("node1"); err != nil {
		t.Fatal(err)
	}
	p1, err := c.waitPrimary(ctx, 60*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.connect(ctx, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, conn, p1.Term, "kept")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.stop("node1", 20*time.Second)
	if err := c.start("node1"); err != nil {
		t.Fatal(err)
	}
	p2, err := c.waitPrimary(ctx, 30*time.Second, "")
	if err != nil {
		_, st, _ := c.get(ctx, "node1", "/status")
		t.Fatalf("after a clean restart of its only member: %v; /status role %q", err, st.Role)
	}
	if p2.Term <= p1.Term {
		t.Fatalf("term after the restart %d, want above %d", p2.Term, p1.Term)
	}
	conn, err = c.connect(ctx, p2.Name)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM rows WHERE id = $1`, id).Scan(&n)
	conn.Close(ctx)
	if err != nil || n != 1 {
		t.Fatalf("row %d after the restart: count %d, %v", id, n, err)
	}

	// PostgreSQL dies under the primary: the term ends, and the member,
	// promoted last, must not wait for another primary either.
	pid, err := postmasterPID(filepath.Join(dir, "node1", "data"))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p3, err := c.waitPrimary(ctx, 30*time.Second, "")
	for err == nil && p3.Term <= p2.Term { // the old term may still answer for a moment
		time.Sleep(100 * time.Millisecond)
		p3, err = c.waitPrimary(ctx, 30*time.Second, "")
	}
	if err != nil {
		_, st, _ := c.get(ctx, "node1", "/status")
		t.Fatalf("after PostgreSQL died under the only member: %v; /status role %q", err, st.Role)
	}
	t.Logf("the only member led again under term %d after a restart, and under term %d after PostgreSQL died", p2.Term, p3.Term)
}

// postmasterPID reads the postmaster's pid from its data directory.
func postmasterPID(data string) (int, error) {
	b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}
