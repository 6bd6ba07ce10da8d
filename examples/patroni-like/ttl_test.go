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
