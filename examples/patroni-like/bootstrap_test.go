package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBootstrap_WipedBootstrapperDoesNotReinitialize: the member that once
// bootstrapped the cluster comes back, after a whole-cluster restart, with
// an empty data directory (its disk replaced), and alone. It must not run
// initdb again: promoted with a new, empty cluster, it would have every
// other member copy that over their data (pg_rewind fails against another
// cluster, and the fallback is pg_basebackup). It waits, uninitialized,
// until a member with the cluster's data leads, then copies it. Then a
// member whose directory holds another cluster's data must never start.
func TestBootstrap_WipedBootstrapperDoesNotReinitialize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, dir := testCluster(t, 3)
	startAll(t, c)
	p1, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	boot := ""
	for _, e := range c.eventLog() {
		if e.Event == "bootstrap" {
			boot = e.Node
		}
	}
	if boot == "" {
		t.Fatal("no member reported its bootstrap")
	}
	conn, err := c.connect(ctx, p1.Name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := Write(ctx, conn, p1.Term, "precious")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names() {
		if n != p1.Name {
			if err := c.waitReplica(ctx, 90*time.Second, n); err != nil {
				t.Fatal(err)
			}
			readRow(ctx, t, c, n, id, p1.Term)
		}
	}

	for _, n := range c.names() {
		c.stop(n, 20*time.Second)
	}
	if err := os.RemoveAll(filepath.Join(dir, boot, "data")); err != nil {
		t.Fatal(err)
	}
	mark := len(c.eventLog())
	if err := c.start(boot); err != nil {
		t.Fatal(err)
	}
	// Alone and without data: several TTLs, and no primary.
	alone := time.Now()
	if p, err := c.waitPrimary(ctx, 4*testTTL, ""); err == nil {
		t.Fatalf("%s, its data wiped, is primary under term %d: it ran initdb again", p.Name, p.Term)
	}
	t.Logf("%s, wiped and alone, had no primary for %v", boot, time.Since(alone).Round(time.Millisecond))
	for _, e := range c.eventLog()[mark:] {
		if e.Event == "bootstrap" {
			t.Fatalf("%s ran initdb again after the cluster was initialized", e.Node)
		}
	}
	for _, n := range c.names() {
		if n != boot {
			if err := c.start(n); err != nil {
				t.Fatal(err)
			}
		}
	}
	p2, err := c.waitPrimary(ctx, 90*time.Second, boot)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.waitReplica(ctx, 90*time.Second, boot); err != nil {
		t.Fatal(err)
	}
	// The row survived, on the new primary and on the wiped member's copy.
	conn, err = c.connect(ctx, p2.Name)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM rows WHERE id = $1`, id).Scan(&n)
	conn.Close(ctx)
	if err != nil || n != 1 {
		t.Fatalf("row %d on the new primary %s: count %d, %v", id, p2.Name, n, err)
	}
	readRow(ctx, t, c, boot, id, p1.Term)
	t.Logf("%s, wiped, waited without data and copied %s's; the row written under term %d survived", boot, p2.Name, p1.Term)

	// Another cluster's data in a member's directory (restored from
	// elsewhere, say): that member must never start, let alone lead.
	for _, n := range c.names() {
		if n != boot {
			continue
		}
		c.stop(n, 20*time.Second)
		cfg := c.cfgs[0]
		for _, k := range c.cfgs {
			if k.Name == n {
				cfg = k
			}
		}
		cfg = cfg.withDefaults()
		cfg.PostgreSQL.DataDir = filepath.Join(dir, n, "other")
		other, err := NewPostgres(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Initdb(ctx); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(dir, n, "data")
		if err := os.RemoveAll(data); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cfg.PostgreSQL.DataDir, data); err != nil {
			t.Fatal(err)
		}
		if err := c.start(n); err != nil {
			t.Fatal(err)
		}
		err = waitFor(ctx, 30*time.Second, n+" reporting foreign data", func(ctx context.Context) bool {
			_, st, err := c.get(ctx, n, "/status")
			return err == nil && st.Role == RoleForeign
		})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * testLoopWait)
		if code, _, err := c.get(ctx, n, "/replica"); err == nil && code == 200 {
			t.Fatalf("%s runs another cluster's data as a replica", n)
		}
		if conn, err := c.connect(ctx, n); err == nil {
			conn.Close(ctx)
			t.Fatalf("%s started PostgreSQL on another cluster's data", n)
		}
		t.Logf("%s, with another cluster's data, reports %s and runs no PostgreSQL", n, RoleForeign)
	}
}
