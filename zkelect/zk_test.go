package zkelect_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

// ttl is the session timeout of the tests' connections. With tickTime
// 100 ms the server accepts 200 ms .. 20 s.
const ttl = 2 * time.Second

var server *zkserver.Ensemble

func TestMain(m *testing.M) {
	if err := zkserver.Installed(); err != nil {
		fmt.Fprintln(os.Stderr, "zkelect tests need ZooKeeper:", err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "tenure-zk-")
	if err != nil {
		panic(err)
	}
	server, err = zkserver.Start(dir, zkserver.Options{Servers: 1, MaxSessionTimeout: 20 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	server.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func dial(t testing.TB, endpoints []string, opts ...zkelect.Option) *zkelect.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := zkelect.Dial(ctx, endpoints, ttl, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return b
}

// harness gives each backend its own connection behind its own fault proxy.
type harness struct {
	mu       sync.Mutex
	proxies  map[election.Backend]*faultproxy.Proxy
	backends []*zkelect.Backend
	admin    *zk.Conn
}

func newHarness(t *testing.T, endpoints []string, opts ...zkelect.Option) electiontest.Harness {
	admin, _, err := zk.Connect(endpoints, ttl, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{proxies: map[election.Backend]*faultproxy.Proxy{}, admin: admin}
	t.Cleanup(admin.Close)
	return electiontest.Harness{
		TTL: ttl,
		// The server expires sessions in tickTime buckets; then one watch
		// delivery and one read.
		FailoverSlack: 500 * time.Millisecond,
		Arrivals:      50,
		NewBackend: func(t testing.TB) election.Backend {
			var eps []string
			var ps []*faultproxy.Proxy
			for _, ep := range endpoints {
				p, err := faultproxy.New(ep)
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
				eps = append(eps, p.Addr())
			}
			b := dial(t, eps, opts...)
			h.mu.Lock()
			h.proxies[b] = ps[0]
			h.backends = append(h.backends, b)
			h.mu.Unlock()
			t.Cleanup(func() {
				b.Close()
				for _, p := range ps {
					p.Close()
				}
			})
			return b
		},
		Crash: func(_ testing.TB, b election.Backend) {
			// The process is gone: nothing it sends arrives any more.
			h.mu.Lock()
			p := h.proxies[b]
			h.mu.Unlock()
			p.Blackhole()
		},
		Cut: func(_ testing.TB, b election.Backend) {
			h.mu.Lock()
			p := h.proxies[b]
			h.mu.Unlock()
			p.Cut()
		},
		CutOff: func(_ testing.TB, b election.Backend) func() {
			h.mu.Lock()
			p := h.proxies[b]
			h.mu.Unlock()
			p.Blackhole()
			return p.Heal
		},
		DeleteEntry: func(t testing.TB, term tenure.Term) {
			if err := h.admin.Delete(term.Entry, -1); err != nil {
				t.Fatalf("delete %s: %v", term.Entry, err)
			}
		},
		ExpireSession: func(t testing.TB, key, identity string) {
			// ZooKeeper has no call that kills another client's session: cut
			// the client off until the server has expired its session (its
			// node disappears), then heal, so the client learns it on
			// reconnection, as it would after a real partition.
			children, _, err := h.admin.Children(key)
			if err != nil {
				t.Fatal(err)
			}
			var owner int64
			var node string
			for _, c := range children {
				d, st, err := h.admin.Get(key + "/" + c)
				if err == nil && string(d) == identity {
					owner, node = st.EphemeralOwner, key+"/"+c
				}
			}
			if owner == 0 {
				t.Fatalf("no node of %s under %s", identity, key)
			}
			h.mu.Lock()
			var p *faultproxy.Proxy
			for _, b := range h.backends {
				if b.Conn().SessionID() == owner {
					p = h.proxies[b]
				}
			}
			h.mu.Unlock()
			if p == nil {
				t.Fatalf("no backend with session %#x", owner)
			}
			p.Blackhole()
			deadline := time.Now().Add(3 * ttl)
			for {
				ok, _, err := h.admin.Exists(node)
				if err == nil && !ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("session %#x not expired within %v", owner, 3*ttl)
				}
				time.Sleep(10 * time.Millisecond)
			}
			p.Heal()
		},
	}
}

func TestConformance_ZooKeeper(t *testing.T) { electiontest.Run(t, newHarness(t, server.Endpoints())) }
