package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/redisserver"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

var endpoint, zkEndpoint, redisEndpoint string

// env is one backend the CLI tests run against.
type env struct {
	backend  string // the --backend flag
	endpoint string
}

func (v env) key(t *testing.T) string {
	k := testKey(t)
	if v.backend == "zk" {
		return "/" + k
	}
	return k
}

// flags are the --backend and --endpoints flags for v.
func (v env) flags(endpoint string) []string {
	if endpoint == "" {
		endpoint = v.endpoint
	}
	return []string{"--backend", v.backend, "--endpoints", endpoint}
}

// eachBackend runs f as a subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, v env)) {
	for _, v := range []env{{"etcd", endpoint}, {"zk", zkEndpoint}} {
		t.Run(v.backend, func(t *testing.T) { f(t, v) })
	}
}

// electionBackend opens a backend client for in-test candidates.
func (v env) electionBackend(t *testing.T, ttl time.Duration) election.Backend {
	t.Helper()
	if v.backend == "zk" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b, err := zkelect.Dial(ctx, []string{v.endpoint}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		return b
	}
	return etcdelect.New(newClient(t, v.endpoint))
}

// queued returns how many candidates wait on (or hold) key.
func (v env) queued(t *testing.T, key string) int {
	t.Helper()
	if v.backend == "zk" {
		conn, _, err := zk.Connect([]string{v.endpoint}, 5*time.Second, zk.WithLogInfo(false))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		children, _, err := conn.Children(key)
		if err != nil {
			return 0
		}
		return len(children)
	}
	if v.backend == "redis" {
		// The holder's key, and the waiters registered in <key>:waiting.
		rdb := redis.NewClient(&redis.Options{Addr: v.endpoint})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		held, err1 := rdb.Exists(ctx, key).Result()
		waiting, err2 := rdb.ZCard(ctx, key+":waiting").Result()
		if err1 != nil || err2 != nil {
			return -1
		}
		return int(held + waiting)
	}
	if v.backend != "etcd" {
		t.Fatalf("queued: backend %q", v.backend)
	}
	cli := newClient(t, v.endpoint)
	r, err := cli.Get(context.Background(), key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return -1
	}
	return int(r.Count)
}

// waitQueuedOn waits until key has n candidates.
func (v env) waitQueued(t *testing.T, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for v.queued(t, key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("key %s never had %d candidates", key, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMain runs the test binary as the tenure CLI when TENURE_TEST_AS_CLI is
// set, so the tests start real tenure processes without building one.
func TestMain(m *testing.M) {
	if os.Getenv("TENURE_TEST_AS_CLI") == "1" {
		if dir := os.Getenv("TENURE_TEST_HOLD_BEFORE_START"); dir != "" {
			beforeStart = func() { holdBeforeStart(dir) }
		}
		if dir := os.Getenv("TENURE_TEST_HOLD_BEFORE_WATCH"); dir != "" {
			beforeGuardWatch = func() { holdAt(dir, "watch-held", "watch-go") }
		}
		if dir := os.Getenv("TENURE_TEST_HOLD_AFTER_START"); dir != "" {
			afterCmdStart = func() { holdAt(dir, "started-held", "started-go") }
		}
		if dir := os.Getenv("TENURE_TEST_HOLD_BEFORE_SELECT"); dir != "" {
			var once sync.Once
			beforeSelect = func() { once.Do(func() { holdAt(dir, "loop-held", "loop-go") }) }
		}
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	dir, err := os.MkdirTemp("", "tenure-cli-")
	if err != nil {
		panic(err)
	}
	srv, err := etcdembed.Start(dir)
	if err != nil {
		panic(err)
	}
	endpoint = srv.Endpoint
	if err := zkserver.Installed(); err != nil {
		fmt.Fprintln(os.Stderr, "the CLI tests need ZooKeeper:", err)
		os.Exit(1)
	}
	zks, err := zkserver.Start(filepath.Join(dir, "zk"), zkserver.Options{Servers: 1, MaxSessionTimeout: 20 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	zkEndpoint = zks.Endpoint(0)
	rs, err := redisserver.Start(filepath.Join(dir, "redis"), redisserver.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisEndpoint = rs.Addr()
	code := m.Run()
	rs.Close()
	zks.Close()
	srv.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// holdBeforeStart, run by a tenure started with
// TENURE_TEST_HOLD_BEFORE_START=dir just before it starts CMD, creates
// dir/held and returns once dir/go exists.
func holdBeforeStart(dir string) { holdAt(dir, "held", "go") }

// holdAt creates dir/held and returns once dir/proceed exists. With
// TENURE_TEST_HOLD_BEFORE_SELECT=dir, tenure holds there (loop-held,
// loop-go) before the first wait of its loop while CMD runs.
func holdAt(dir, held, proceed string) {
	_ = os.WriteFile(filepath.Join(dir, held), []byte("held\n"), 0o600)
	for {
		if _, err := os.Stat(filepath.Join(dir, proceed)); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var keySeq atomic.Int64

func testKey(t *testing.T) string {
	return fmt.Sprintf("cli-test/%s/%d", t.Name(), keySeq.Add(1))
}

// tenureCmd returns an unstarted tenure process.
func tenureCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "TENURE_TEST_AS_CLI=1")
	return cmd
}

type proc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
	code   int
}

// needSignal skips t when sig is ignored in this process. The tenure
// processes a test starts inherit that, and tenure keeps a SIGHUP or
// SIGINT it was started ignoring, by design (`nohup tenure exec` must
// survive its terminal: TestExec_NohupSurvivesSIGHUP), so they would not
// react to sig. It happens when the tests themselves run under nohup
// (SIGHUP), or as the background job of a shell without job control
// (SIGINT).
func needSignal(t *testing.T, sig os.Signal) {
	t.Helper()
	if signal.Ignored(sig) {
		t.Skipf("%v is ignored in the test process (run under nohup, or in the background of a shell without job control), so the tenure it starts ignores it too", sig)
	}
}

func start(t *testing.T, args ...string) *proc {
	t.Helper()
	return startCmd(t, tenureCmd(args...))
}

// startArmed starts tenure with args as start does, and returns once
// tenure has started CMD and told its guard of it (the after-start hook,
// passed through at once): a test that kills tenure after this tests the
// guard, not the moment between CMD's start and that pipe write
// (TestExec_KilledRightAfterTheStartLeavesNoOrphans holds tenure there).
func startArmed(t *testing.T, dir string, args ...string) *proc {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "started-go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := tenureCmd(args...)
	cmd.Env = append(cmd.Env, "TENURE_TEST_HOLD_AFTER_START="+dir)
	p := startCmd(t, cmd)
	waitFile(t, filepath.Join(dir, "started-held"), 15*time.Second)
	return p
}

// startCmd starts cmd, unstarted, as a proc: stderr kept, killed at the
// end of the test.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{cmd: cmd, stderr: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// exitWithin waits for p, started, to exit and returns its status; after
// d it kills p and fails t, naming what.
func exitWithin(t *testing.T, p *exec.Cmd, d time.Duration, what string) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case <-done:
	case <-time.After(d):
		_ = p.Process.Kill()
		<-done
		t.Fatalf("%s did not exit within %v", what, d)
	}
	return p.ProcessState.ExitCode()
}

func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("tenure %v did not exit within %v; stderr: %s", p.cmd.Args[1:], d, p.stderr)
		return -1
	}
}

func newClient(t *testing.T, ep string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// waitFile waits until path exists with content and returns it.
func waitFile(t *testing.T, path string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written within %v", path, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func nanos(t *testing.T, s string) time.Time {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatalf("bad timestamp %q: %v", s, err)
	}
	return time.Unix(0, n)
}

func pidIn(t *testing.T, path string) int {
	pid, err := strconv.Atoi(waitFile(t, path, 15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func dirT(t *testing.T) string { return t.TempDir() }

func path(dir, name string) string { return filepath.Join(dir, name) }
