package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/internal/etcdembed"
)

// TestRun_TTLTheServerRefusesStopsTheManager: ttl 1 s passes the
// configuration's checks, but an etcd with its default timing grants no
// lease under 2 s, and the backend refuses the longer lease it gets
// (ErrInvalidConfig). The manager must stop with that error: campaigning
// again is refused again, and no member would ever be promoted. Before, it
// logged "election stopped" and campaigned again on every pass, forever.
func TestRun_TTLTheServerRefusesStopsTheManager(t *testing.T) {
	if _, err := findBinDir(); err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's postgresql package)", err)
	}
	dir := t.TempDir()
	srv, err := etcdembed.StartTimed(filepath.Join(dir, "etcd"), 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	self := Member{Name: "node1", API: "127.0.0.1:" + strconv.Itoa(ports[0]), Postgres: "127.0.0.1:" + strconv.Itoa(ports[1])}
	cfg := Config{
		Name: "node1", Scope: "ttl",
		DCS: DCSConfig{Backend: "etcd", Endpoints: []string{srv.Endpoint}, TTL: time.Second, LoopWait: 400 * time.Millisecond},
		PostgreSQL: PostgreSQLConfig{DataDir: filepath.Join(dir, "node1", "data"),
			Parameters: map[string]string{"fsync": "off", "shared_buffers": "16MB"}},
		Members: []Member{self},
	}
	b, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "node1.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg, err = LoadConfig(path); err != nil {
		t.Fatalf("ttl 1s must pass the configuration's own checks (the server decides): %v", err)
	}
	m, err := NewManager(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	begun := time.Now()
	err = m.Run(ctx)
	t.Logf("Run with a TTL the server refuses: %v after %v", err, time.Since(begun))
	if !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Run = %v, want the server's refusal (ErrInvalidConfig) before its ctx ended", err)
	}
	if m.pg.Running() {
		t.Error("PostgreSQL still runs after Run returned")
	}
}

// memberPair returns the members node1, its API and PostgreSQL on host1,
// and node2, on host2, at free ports.
func memberPair(t *testing.T, host1, host2 string) []Member {
	t.Helper()
	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	return []Member{
		{Name: "node1", API: host1 + ":" + strconv.Itoa(ports[0]), Postgres: host1 + ":" + strconv.Itoa(ports[1])},
		{Name: "node2", API: host2 + ":" + strconv.Itoa(ports[2]), Postgres: host2 + ":" + strconv.Itoa(ports[3])},
	}
}

// startPrimaryAndStandby makes primary a running primary (initdb,
// configure, start) and standby its running standby (base backup,
// configure, standby.signal, start). It fails t on any step, with the tail
// of the standby's log when the standby does not start within 20 s.
func startPrimaryAndStandby(ctx context.Context, t *testing.T, primary, standby *Postgres) {
	t.Helper()
	for _, step := range []func() error{
		func() error { return primary.Initdb(ctx) },
		func() error { return primary.Configure("", false) },
		func() error { return primary.Start(ctx) },
		func() error { return standby.BaseBackup(ctx, primary.Addr()) },
		func() error { return standby.Configure(primary.Addr(), true) },
		func() error { return standby.SetStandby(true) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	err := standby.Start(sctx)
	cancel()
	if err != nil {
		b, _ := os.ReadFile(standby.LogFile())
		t.Fatalf("the standby, copied from the primary %s, did not start on its own address %s: %v; log tail: %s", primary.Addr(), standby.Addr(), err, lastLines(string(b), 5))
	}
}

// TestConfigure_EachMemberListensOnItsOwnAddressWithItsOwnParameters: a
// standby's data comes from another member (pg_basebackup, pg_rewind),
// postgresql.conf included. Its listen address and parameters must be its
// own. Before, they were the bootstrapper's: on another host the standby
// could not start, and its own parameters never took effect.
func TestConfigure_EachMemberListensOnItsOwnAddressWithItsOwnParameters(t *testing.T) {
	if _, err := findBinDir(); err != nil {
		t.Fatalf("%v (scripts/test.sh installs Debian's postgresql package)", err)
	}
	dir := t.TempDir()
	members := memberPair(t, "127.0.0.1", "127.0.0.2")
	pgs := map[string]*Postgres{}
	for i, m := range members {
		cfg := Config{
			Name: m.Name, Scope: "conf",
			DCS: DCSConfig{Backend: "etcd", Endpoints: []string{"127.0.0.1:2379"}, TTL: 3 * time.Second, LoopWait: 500 * time.Millisecond},
			PostgreSQL: PostgreSQLConfig{DataDir: filepath.Join(dir, m.Name, "data"),
				// cluster_name is the manager's: the parameter must not win.
				Parameters: map[string]string{"fsync": "off", "shared_buffers": "16MB", "work_mem": strconv.Itoa(5+2*i) + "MB", "cluster_name": "x"}},
			Members: members,
		}
		b, err := cfg.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, m.Name+".yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if cfg, err = LoadConfig(path); err != nil {
			t.Fatal(err)
		}
		p, err := NewPostgres(cfg)
		if err != nil {
			t.Fatal(err)
		}
		pgs[m.Name] = p
		t.Cleanup(func() { p.Stop(0) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// node2, copied from node1, must start on its own address.
	startPrimaryAndStandby(ctx, t, pgs["node1"], pgs["node2"])
	for name, want := range map[string]string{"node1": "5MB", "node2": "7MB"} {
		conn, err := pgs[name].Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got, listen, cluster string
		err = conn.QueryRow(ctx, `SELECT current_setting('work_mem'), current_setting('listen_addresses'), current_setting('cluster_name')`).Scan(&got, &listen, &cluster)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: listen_addresses %s, work_mem %s, cluster_name %s", name, listen, got, cluster)
		if got != want {
			t.Errorf("%s's work_mem = %s, want its own configuration's %s", name, got, want)
		}
		if cluster != name {
			t.Errorf("%s's cluster_name = %q: a parameter won over the manager's own setting", name, cluster)
		}
	}
}
