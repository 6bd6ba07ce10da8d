// Package fencing_test shows the fencing verifiers refusing a holder that
// was frozen past its lease and woke up believing it still holds.
package fencing_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/fence/etcdfence"
	"github.com/tenure-go/tenure/fence/pgfence"
	"github.com/tenure-go/tenure/fence/zkfence"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/pgserver"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

const ttl = 2 * time.Second

var etcdEndpoint, zkEndpoint, pgDSN string

func TestMain(m *testing.M) {
	if os.Getenv("TENURE_FENCE_HOLDER") == "1" {
		os.Exit(holderMain())
	}
	code := func() int {
		dir, err := os.MkdirTemp("", "tenure-fencing-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		for _, check := range []func() error{zkserver.Installed, pgserver.Installed} {
			if err := check(); err != nil {
				fmt.Fprintln(os.Stderr, "the fencing tests need ZooKeeper and PostgreSQL:", err)
				return 1
			}
		}
		etcd, err := etcdembed.Start(filepath.Join(dir, "etcd"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer etcd.Close()
		etcdEndpoint = etcd.Endpoint
		zks, err := zkserver.Start(filepath.Join(dir, "zk"), zkserver.Options{Servers: 1, MaxSessionTimeout: 20 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer zks.Close()
		zkEndpoint = zks.Endpoint(0)
		pg, err := pgserver.Start(filepath.Join(dir, "pg"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pg.Close()
		if err := pg.CreateDatabase("fencing"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		pgDSN = pg.DSN("fencing")
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// site is one backend's view of the protected resources.
type site struct {
	backend string
	newLock func(t testing.TB, key, id string) *election.Mutex
	write   func(t testing.TB, term tenure.Term, value string) error // the backend-side fenced write
	// writeCounted is write with refusals counted on m.
	writeCounted func(t testing.TB, term tenure.Term, value string, m *fence.Metrics) error
	read         func(t testing.TB) string
}

// TestPause_EveryVerifierRefusesTheFrozenHolder: holder A (a child
// process) takes the lock under term a and is frozen with SIGSTOP past its
// TTL; B takes the lock under term b > a and writes through every
// verifier; A is resumed and, believing it still holds, writes with term a:
// the backend fence, PostgreSQL and the HTTP guard all refuse it, and B's
// data is intact.
func TestPause_EveryVerifierRefusesTheFrozenHolder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := (pgfence.Fence{}).Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS fenced_writes (resource text, writer text, token bigint)`); err != nil {
		t.Fatal(err)
	}
	for _, s := range []site{etcdSite(t, etcdEndpoint), zkSite(t, zkEndpoint)} {
		t.Run(s.backend, func(t *testing.T) { testPause(ctx, t, s, pool) })
	}
}

func testPause(ctx context.Context, t *testing.T, s site, pool *pgxpool.Pool) {
	key := fmt.Sprintf("/fencing/%s-%d", s.backend, time.Now().UnixNano())
	// The HTTP resource: a service that takes orders from the leader.
	var mu sync.Mutex
	var accepted []string
	guard := &fence.Guard{}
	srv := httptest.NewServer(fence.Middleware(guard, key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		accepted = append(accepted, string(b))
		mu.Unlock()
	})))
	defer srv.Close()

	// A: a separate process, so that SIGSTOP freezes it for real.
	a := exec.Command(os.Args[0], "-test.run=^$")
	a.Env = append(os.Environ(), "TENURE_FENCE_HOLDER=1", "HOLDER_BACKEND="+s.backend, "HOLDER_KEY="+key,
		"HOLDER_ETCD="+etcdEndpoint, "HOLDER_ZK="+zkEndpoint, "HOLDER_PG="+pgDSN, "HOLDER_URL="+srv.URL)
	a.Stderr = os.Stderr
	stdin, _ := a.StdinPipe()
	stdout, _ := a.StdoutPipe()
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Process.Kill(); _ = a.Wait() }()
	lines := bufio.NewScanner(stdout)
	next := func() string {
		t.Helper()
		ch := make(chan string, 1)
		go func() {
			if lines.Scan() {
				ch <- lines.Text()
			} else {
				ch <- "EOF"
			}
		}()
		select {
		case l := <-ch:
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("holder A said nothing for 30 s")
			return ""
		}
	}
	var tokenA uint64
	var entryA string
	if _, err := fmt.Sscanf(next(), "LOCKED %d %s", &tokenA, &entryA); err != nil {
		t.Fatalf("A did not lock: %v", err)
	}
	// A writes once while it holds: accepted everywhere.
	fmt.Fprintln(stdin, "write A-before")
	for range 3 {
		if l := next(); !strings.HasSuffix(l, " ok") {
			t.Fatalf("A's write while holding: %q", l)
		}
	}

	// Freeze A past its TTL; B takes the lock.
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	b := s.newLock(t, key, "B")
	termB, err := b.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: A frozen under term %d; B locked under term %d %v later", s.backend, tokenA, termB.Token, time.Since(frozen).Round(time.Millisecond))
	if termB.Token <= tokenA {
		t.Fatalf("B's term %d not above A's %d", termB.Token, tokenA)
	}
	if err := s.write(t, termB, "B"); err != nil {
		t.Fatalf("B's backend write: %v", err)
	}
	if err := (pgfence.Fence{}).Do(ctx, pool, key, termB.Token, insert(key, "B", termB.Token)); err != nil {
		t.Fatalf("B's PostgreSQL write: %v", err)
	}
	if code := post(t, srv.URL, termB.Token, "B"); code != 200 {
		t.Fatalf("B's HTTP write: %d", code)
	}

	// A wakes up believing it still holds, and writes with term a.
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(stdin, "write A-after")
	results := map[string]string{}
	for range 3 {
		f := strings.Fields(next())
		if len(f) < 3 || f[0] != "RESULT" {
			t.Fatalf("A's result line %q", f)
		}
		results[f[1]] = f[2]
	}
	for _, v := range []string{s.backend, "postgres", "http"} {
		if results[v] != "stale" {
			t.Errorf("%s accepted or failed A's stale write: %q, want stale", v, results[v])
		}
	}
	// The same stale term sent from here counts as a rejection by each
	// verifier's metrics.
	reg := prometheus.NewRegistry()
	m, err := fence.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	termA := tenure.Term{Token: tokenA, Key: key, Backend: s.backend, Entry: entryA}
	if err := s.writeCounted(t, termA, "A-late", m); !errors.Is(err, fence.ErrStale) {
		t.Errorf("%s fence with A's term from here: %v, want stale", s.backend, err)
	}
	if err := (pgfence.Fence{Metrics: m}).Do(ctx, pool, key, tokenA, insert(key, "A-late", tokenA)); !errors.Is(err, fence.ErrStale) {
		t.Errorf("postgres with A's term from here: %v, want stale", err)
	}
	if err := guard.Do(key, tokenA, func() error { return nil }); !errors.Is(err, fence.ErrStale) {
		t.Errorf("the in-process guard accepted A's term %d after B's %d: %v", tokenA, termB.Token, err)
	}
	for _, v := range []string{s.backend, "postgres"} {
		if got := testutil.ToFloat64(m.Rejections().WithLabelValues(key, v)); got != 1 {
			t.Errorf("tenure_fence_rejections_total{key, backend=%q} = %v, want 1", v, got)
		}
	}

	// B's data is intact.
	if got := s.read(t); got != "B" {
		t.Errorf("%s holds %q after A's stale write, want B", s.backend, got)
	}
	rows, err := pool.Query(ctx, `SELECT writer FROM fenced_writes WHERE resource = $1 ORDER BY token`, key)
	if err != nil {
		t.Fatal(err)
	}
	writers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(writers, ",") != "A-before,B" {
		t.Errorf("PostgreSQL rows %v, want [A-before B]", writers)
	}
	mu.Lock()
	if strings.Join(accepted, ",") != "A-before,B" {
		t.Errorf("HTTP accepted %v, want [A-before B]", accepted)
	}
	mu.Unlock()
	_ = stdin.Close()
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func insert(resource, writer string, token uint64) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO fenced_writes (resource, writer, token) VALUES ($1, $2, $3)`, resource, writer, int64(token))
		return err
	}
}

func post(t testing.TB, url string, token uint64, body string) int {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set(fence.HeaderTerm, strconv.FormatUint(token, 10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func etcdClient(t testing.TB) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdEndpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func etcdSite(t testing.TB, endpoint string) site {
	etcdEndpoint = endpoint
	cli := etcdClient(t)
	t.Cleanup(func() { cli.Close() })
	const data = "/fencing-data/etcd"
	return site{
		backend: "etcd",
		newLock: func(t testing.TB, key, id string) *election.Mutex {
			c := etcdClient(t)
			m, err := election.NewMutex(etcdelect.New(c), election.Config{Key: key, Identity: id, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close(context.Background()); c.Close() })
			return m
		},
		write: func(t testing.TB, term tenure.Term, v string) error {
			_, err := etcdfence.Fence{Client: cli}.Txn(context.Background(), term, clientv3.OpPut(data, v))
			return err
		},
		writeCounted: func(t testing.TB, term tenure.Term, v string, m *fence.Metrics) error {
			_, err := etcdfence.Fence{Client: cli, Metrics: m}.Txn(context.Background(), term, clientv3.OpPut(data, v))
			return err
		},
		read: func(t testing.TB) string {
			r, err := cli.Get(context.Background(), data)
			if err != nil || len(r.Kvs) == 0 {
				t.Fatalf("read %s: %v", data, err)
			}
			return string(r.Kvs[0].Value)
		},
	}
}

func zkSite(t testing.TB, endpoint string) site {
	zkEndpoint = endpoint
	conn, _, err := zk.Connect([]string{zkEndpoint}, ttl, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	const data = "/fencing-data"
	if _, err := conn.Create(data, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		t.Fatal(err)
	}
	return site{
		backend: "zookeeper",
		newLock: func(t testing.TB, key, id string) *election.Mutex {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, err := zkelect.Dial(ctx, []string{zkEndpoint}, ttl)
			if err != nil {
				t.Fatal(err)
			}
			m, err := election.NewMutex(b, election.Config{Key: key, Identity: id, TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close(context.Background()); b.Close() })
			return m
		},
		write: func(t testing.TB, term tenure.Term, v string) error {
			// A process that wakes from a freeze finds its ZooKeeper session
			// expired and its connection broken (no server, connection
			// closed, broken pipe, ...) until go-zookeeper reconnects: retry
			// until the fence answers.
			deadline := time.Now().Add(10 * time.Second)
			for {
				_, err := zkfence.Fence{Conn: conn}.Multi(term, &zk.SetDataRequest{Path: data, Data: []byte(v), Version: -1})
				if err != nil && !errors.Is(err, fence.ErrStale) && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				return err
			}
		},
		writeCounted: func(t testing.TB, term tenure.Term, v string, m *fence.Metrics) error {
			_, err := zkfence.Fence{Conn: conn, Metrics: m}.Multi(term, &zk.SetDataRequest{Path: data, Data: []byte(v), Version: -1})
			return err
		},
		read: func(t testing.TB) string {
			d, _, err := conn.Get(data)
			if err != nil {
				t.Fatal(err)
			}
			return string(d)
		},
	}
}

// quiet drops go-zookeeper's log lines.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
