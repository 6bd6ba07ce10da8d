package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const goodConfig = `
name: node1
scope: prod
dcs:
  endpoints: [127.0.0.1:2379]
  ttl: 10s
  loop_wait: 1s
postgresql:
  data_dir: node1/data
  parameters: {fsync: "off"}
members:
  - {name: node1, api: 127.0.0.1:8008, postgres: 127.0.0.1:5432}
  - {name: node2, api: 127.0.0.1:8009, postgres: 127.0.0.1:5433}
`

// TestLoadConfig_RelativeFileGivesAbsolutePaths: with --config node1.yaml
// (a relative path, as the README runs it), data_dir and bin_dir come out
// absolute: PostgreSQL's programs run in "/", where "node1/data" would
// name /node1/data.
func TestLoadConfig_RelativeFileGivesAbsolutePaths(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(goodConfig, "  data_dir: node1/data\n", "  data_dir: node1/data\n  bin_dir: bin\n", 1)
	if text == goodConfig {
		t.Fatal("the test's config has no data_dir line to extend")
	}
	if err := os.WriteFile(filepath.Join(dir, "node1.yaml"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	cfg, err := LoadConfig("node1.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "node1", "data"); cfg.PostgreSQL.DataDir != want {
		t.Errorf("data_dir = %q, want %q", cfg.PostgreSQL.DataDir, want)
	}
	if want := filepath.Join(dir, "bin"); cfg.PostgreSQL.BinDir != want {
		t.Errorf("bin_dir = %q, want %q", cfg.PostgreSQL.BinDir, want)
	}
}

// TestParseConfig_DefaultsAndPaths reads a valid file: defaults are applied,
// a relative data_dir is taken relative to the file, and the keys derive
// from the scope.
func TestParseConfig_DefaultsAndPaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node1.yaml")
	if err := os.WriteFile(path, []byte(goodConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DCS.Backend != "etcd" || cfg.DCS.TTL != 10*time.Second || cfg.PostgreSQL.RunAs != "postgres" || cfg.DCS.MaximumLagOnFailover != 1<<20 {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if want := filepath.Join(dir, "node1/data"); cfg.PostgreSQL.DataDir != want {
		t.Errorf("data_dir = %q, want %q", cfg.PostgreSQL.DataDir, want)
	}
	if cfg.LeaderKey() != "/patroni-like/prod/leader" || cfg.Self().Postgres != "127.0.0.1:5432" {
		t.Errorf("LeaderKey %q, Self %+v", cfg.LeaderKey(), cfg.Self())
	}
	// A configuration survives a round trip through Marshal.
	b, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseConfig(strings.NewReader(string(b)), "/")
	if err != nil {
		t.Fatalf("re-parse: %v\n%s", err, b)
	}
	if again.DCS.TTL != cfg.DCS.TTL || again.PostgreSQL.DataDir != cfg.PostgreSQL.DataDir || len(again.Members) != 2 {
		t.Errorf("round trip changed the configuration: %+v", again)
	}
}

// TestParseConfig_RefusesBadInput checks that every kind of mistake is an
// error naming the field, never a panic, and that all problems of a file
// are reported at once.
func TestParseConfig_RefusesBadInput(t *testing.T) {
	cases := []struct {
		name, edit, want string
	}{
		{"empty file", "", "empty"},
		{"not yaml", "name: [", "yaml"},
		{"unknown key", goodConfig + "colour: red\n", "colour"},
		{"missing name", strings.Replace(goodConfig, "name: node1\n", "", 1), "name is required"},
		{"name not a member", strings.Replace(goodConfig, "name: node1\n", "name: node9\n", 1), `"node9" is not among members`},
		{"zookeeper", strings.Replace(goodConfig, "dcs:\n", "dcs:\n  backend: zookeeper\n", 1), "etcd only"},
		{"redis", strings.Replace(goodConfig, "dcs:\n", "dcs:\n  backend: redis\n", 1), "efficiency-only"},
		{"fractional ttl", strings.Replace(goodConfig, "ttl: 10s", "ttl: 1500ms", 1), "whole seconds"},
		{"ttl not a duration", strings.Replace(goodConfig, "ttl: 10s", "ttl: ten", 1), "ten"},
		{"loop_wait too long", strings.Replace(goodConfig, "loop_wait: 1s", "loop_wait: 5s", 1), "below ttl/2"},
		{"negative maximum lag", strings.Replace(goodConfig, "loop_wait: 1s", "loop_wait: 1s\n  maximum_lag_on_failover: -1", 1), "not negative"},
		{"maximum lag not a number", strings.Replace(goodConfig, "loop_wait: 1s", "loop_wait: 1s\n  maximum_lag_on_failover: 1MB", 1), "1MB"},
		{"bad endpoint", strings.Replace(goodConfig, "[127.0.0.1:2379]", "[localhost]", 1), "host:port"},
		{"duplicate member", strings.Replace(goodConfig, "name: node2,", "name: node1,", 1), "appears twice"},
		{"duplicate address", strings.Replace(goodConfig, "127.0.0.1:5433", "127.0.0.1:5432", 1), "is also"},
		{"postgres host not an IP", strings.Replace(goodConfig, "127.0.0.1:5433", "db2:5433", 1), "IP address"},
		{"no data_dir", strings.Replace(goodConfig, "  data_dir: node1/data\n", "", 1), "data_dir is required"},
		{"bad port", strings.Replace(goodConfig, "127.0.0.1:8009", "127.0.0.1:99999", 1), "1-65535"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig(strings.NewReader(tc.edit), "/")
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a *ConfigError", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
	// Several problems at once are all reported.
	bad := strings.NewReplacer("ttl: 10s", "ttl: 0.5s", "[127.0.0.1:2379]", "[]").Replace(goodConfig)
	_, err := ParseConfig(strings.NewReader(bad), "/")
	var ce *ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) < 2 {
		t.Fatalf("want two problems, got %v", err)
	}
	// An unknown key does not hide the other problems: it was reported
	// alone before.
	bad = strings.Replace(goodConfig, "ttl: 10s", "ttl: 10500ms", 1) + "colour: red\n"
	_, err = ParseConfig(strings.NewReader(bad), "/")
	if !errors.As(err, &ce) || len(ce.Problems) != 2 || !strings.Contains(err.Error(), "colour") || !strings.Contains(err.Error(), "whole seconds") {
		t.Fatalf("an unknown key and a fractional ttl: got %v, want both reported", err)
	}
}

// TestPrepareDir_LeavesAForeignDirectoryAlone: a data_dir set by mistake
// to a directory in use is not deleted when the member copies the
// primary: only an empty directory, a PostgreSQL data directory or one
// the manager made is. Before, any directory without PG_VERSION went
// (os.RemoveAll), the configuration file's own directory included.
func TestPrepareDir_LeavesAForeignDirectoryAlone(t *testing.T) {
	bin, err := findBinDir()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	p := &Postgres{bin: bin, data: filepath.Join(dir, "data"), logf: filepath.Join(dir, "data.log")}
	sentinel := filepath.Join(p.data, "precious.yml")
	if err := os.MkdirAll(p.data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sentinel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	err = p.BaseBackup(ctx, "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "no PostgreSQL data directory") {
		t.Errorf("BaseBackup into a directory of other files: %v, want a refusal", err)
	}
	if _, err := os.Stat(sentinel); err != nil {
		t.Fatalf("the directory's file is gone: %v", err)
	}
	// A directory the manager made (a copy cut short) is its to replace.
	if err := os.WriteFile(p.ownedPath(), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = p.BaseBackup(ctx, "127.0.0.1:1") // prepares the directory, then cannot connect
	if err == nil || !strings.Contains(err.Error(), "pg_basebackup") {
		t.Errorf("BaseBackup into the manager's own directory: %v, want pg_basebackup's failure", err)
	}
	if _, err := os.Stat(sentinel); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the manager's own partial directory was not replaced: %v", err)
	}
}

// TestRun_EndsWithItsContextAndTakesItsChildren: a repair program whose
// ctx ends is killed with what it started (pg_rewind's postgres
// --single), and run returns then. Before, only the program was killed,
// and run waited for its child, which held the output pipe: 20 s here.
func TestRun_EndsWithItsContextAndTakesItsChildren(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child-pid")
	script := "#!/bin/sh\nsleep 20 &\necho $! > " + pidFile + "\nwait\n"
	if err := os.WriteFile(filepath.Join(dir, "pg_rewind"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &Postgres{bin: dir, data: filepath.Join(dir, "data"), logf: filepath.Join(dir, "data.log")}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	begun := time.Now()
	err := p.run(ctx, "pg_rewind")
	took := time.Since(begun)
	t.Logf("run with a 1 s ctx: %v after %v", err, took)
	if err == nil {
		t.Error("run returned no error for a program its ctx killed")
	}
	if took > 4*time.Second {
		t.Errorf("run returned %v after its ctx ended at 1 s", took)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	// running: it exists and is not a zombie (its reaper may take its
	// time).
	running := func(pid int) bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')')
		return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
	}
	deadline := time.Now().Add(2 * time.Second)
	for pid > 0 && running(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatal("the program's child outlived it")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHBAConf_TrustsEveryMembersHost: pg_hba.conf trusts loopback and each
// member's PostgreSQL host once (IPv4 /32, IPv6 /128, names as written):
// the manager reaches its own PostgreSQL through its member's address, and
// standbys replicate from the primary's, so members on 10.0.0.11-13 need
// those trusted, not only 127.0.0.1.
func TestHBAConf_TrustsEveryMembersHost(t *testing.T) {
	got := hbaConf([]string{"10.0.0.11", "10.0.0.12", "127.0.0.1", "::1", "db3.example", "10.0.0.11"})
	want := "# Written by the patroni-like manager: loopback and the members' hosts, no password.\n" +
		"host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n" +
		"host all all 10.0.0.11/32 trust\nhost replication all 10.0.0.11/32 trust\n" +
		"host all all 10.0.0.12/32 trust\nhost replication all 10.0.0.12/32 trust\n" +
		"host all all ::1/128 trust\nhost replication all ::1/128 trust\n" +
		"host all all db3.example trust\nhost replication all db3.example trust\n"
	if got != want {
		t.Errorf("hbaConf:\n%s\nwant:\n%s", got, want)
	}
}
