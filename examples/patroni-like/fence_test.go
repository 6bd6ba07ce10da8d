package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fencePair starts a primary and one streaming standby of it, on loopback,
// with the test cluster's settings.
func fencePair(t *testing.T) (primary, standby *Postgres) {
	t.Helper()
	if _, err := findBinDir(); err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's postgresql package)", err)
	}
	dir := t.TempDir()
	members := memberPair(t, "127.0.0.1", "127.0.0.1")
	var pgs []*Postgres
	for _, m := range members {
		cfg := Config{
			Name: m.Name, Scope: "fence",
			DCS: DCSConfig{Backend: "etcd", Endpoints: []string{"127.0.0.1:2379"}, TTL: 3 * time.Second, LoopWait: 500 * time.Millisecond},
			PostgreSQL: PostgreSQLConfig{DataDir: filepath.Join(dir, m.Name, "data"),
				Parameters: map[string]string{"fsync": "off", "synchronous_commit": "off", "shared_buffers": "16MB"}},
			Members: members,
		}.withDefaults()
		p, err := NewPostgres(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pgs = append(pgs, p)
		t.Cleanup(func() { p.Stop(0) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p1, p2 := pgs[0], pgs[1]
	startPrimaryAndStandby(ctx, t, p1, p2)
	return p1, p2
}

// TestFence_DrainsThoughAClientHoldsAConnectionOpen: a client that opens a
// TCP connection to a primary being fenced and sends nothing (a port
// check, a half-open connection, a pooler's probe) gets a process of the
// postmaster's that waits for its startup packet, up to
// authentication_timeout (60 s), and PostgreSQL 15 does not exit before
// that process has, even on an immediate shutdown (it SIGKILLs it after
// 5 s). The fence must count as drained as soon as the shutdown
// checkpoint is written and the standby has confirmed it, and stop the
// postmaster at once: before, it waited for the postmaster's exit, hit its
// drain limit, reported a clean shutdown as not drained, and its immediate
// shutdown took 5 s more. Every commit must be on the standby, and the
// control file must say "shut down". The fence must return within 4 s:
// the clean part takes about 100 ms here, an immediate shutdown waits 5 s
// for the silent client's process, and the exit would wait 60 s.
func TestFence_DrainsThoughAClientHoldsAConnectionOpen(t *testing.T) {
	p1, p2 := fencePair(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := p1.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE fenced (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	const rows = 200
	for i := range rows {
		if _, err := conn.Exec(ctx, `INSERT INTO fenced VALUES ($1)`, i); err != nil {
			t.Fatal(err)
		}
	}
	// Fence while the connection is still open (its session is ended by
	// the shutdown, as a writer's is).
	const drain = 10 * time.Second
	type result struct {
		drained bool
		took    time.Duration
	}
	res := make(chan result, 1)
	began := time.Now()
	go func() {
		d := p1.Fence(drain)
		res <- result{d, time.Since(began)}
	}()
	// Once the postmaster is stopping, a client connects and stays silent.
	pidFile := filepath.Join(p1.data, "postmaster.pid")
	for {
		b, _ := os.ReadFile(pidFile)
		if strings.Contains(string(b), "stopping") {
			break
		}
		if time.Since(began) > drain {
			t.Fatal("the postmaster never reported stopping in postmaster.pid")
		}
		time.Sleep(time.Millisecond)
	}
	silent, err := net.Dial("tcp", p1.Addr())
	if err != nil {
		t.Fatalf("the silent client could not connect: %v", err)
	}
	defer silent.Close()
	r := <-res
	t.Logf("fence with a silent client connected: drained %v after %v (drain limit %v)", r.drained, r.took.Round(time.Millisecond), drain)
	if r.took > 4*time.Second {
		t.Fatalf("the fence took %v: it waited for the silent client's process", r.took)
	}
	if !r.drained {
		t.Fatalf("the fence was not drained within %v: it waited for the postmaster's exit, which the silent client's process holds up", drain)
	}
	if p1.Running() {
		t.Fatal("the fenced postmaster still runs")
	}
	f, err := p1.Control(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := f["Database cluster state"]; st != "shut down" {
		t.Fatalf("the fenced primary's control file says %q, want \"shut down\" (a clean shutdown)", st)
	}
	c2, err := p2.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	var n int
	if err := c2.QueryRow(ctx, `SELECT count(*) FROM fenced`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Fatalf("the standby has %d of the %d rows committed before the fence", n, rows)
	}
}
