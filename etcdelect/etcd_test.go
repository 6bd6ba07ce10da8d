package etcdelect_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

var endpoint string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tenure-etcd-")
	if err != nil {
		panic(err)
	}
	srv, err := etcdembed.Start(dir)
	if err != nil {
		panic(err)
	}
	endpoint = srv.Endpoint
	code := m.Run()
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

func newClient(t testing.TB, ep string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	return cli
}

// harness gives each backend its own client behind its own fault proxy, as
// a separate process would have.
type harness struct {
	mu      sync.Mutex
	proxies map[election.Backend]*faultproxy.Proxy
	admin   *clientv3.Client
}

func newHarness(t *testing.T, opts ...etcdelect.Option) electiontest.Harness {
	h := &harness{proxies: map[election.Backend]*faultproxy.Proxy{}, admin: newClient(t, endpoint)}
	t.Cleanup(func() { h.admin.Close() })
	return electiontest.Harness{
		TTL: 2 * time.Second,
		// etcd's lessor looks for expired leases every 500 ms; then one
		// watch delivery and one read.
		FailoverSlack: 700 * time.Millisecond,
		Arrivals:      50,
		NewBackend: func(t testing.TB) election.Backend {
			p, err := faultproxy.New(endpoint)
			if err != nil {
				t.Fatal(err)
			}
			cli := newClient(t, p.Addr())
			b := etcdelect.New(cli, opts...)
			h.mu.Lock()
			h.proxies[b] = p
			h.mu.Unlock()
			t.Cleanup(func() { cli.Close(); p.Close() })
			return b
		},
		Crash: func(_ testing.TB, b election.Backend) {
			// A killed process's connection drops; its lease is not revoked.
			b.(*etcdelect.Backend).Client().Close()
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
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if r, err := h.admin.Delete(ctx, term.Entry); err != nil || r.Deleted != 1 {
				t.Fatalf("delete %s: %v (deleted %v)", term.Entry, err, r)
			}
		},
		ExpireSession: func(t testing.TB, key, identity string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := h.admin.Get(ctx, key+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				if string(kv.Value) == identity {
					if _, err := h.admin.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
						t.Fatal(err)
					}
					return
				}
			}
			t.Fatalf("no entry of %s under %s", identity, key)
		},
	}
}

func TestConformance_Etcd(t *testing.T) { electiontest.Run(t, newHarness(t)) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestInterop_ConcurrencyElectionAndMutex shows that concurrency.Election
// (etcdctl elect) and concurrency.Mutex (etcdctl lock) contend with tenure
// on the same keys, in one arrival-ordered queue; with handover records too
// (written and read on every queue, as on long ones), which the peers
// neither write nor read.
func TestInterop_ConcurrencyElectionAndMutex(t *testing.T) {
	t.Run("records=long-queues", func(t *testing.T) { interopConcurrency(t) })
	t.Run("records=always", func(t *testing.T) { interopConcurrency(t, etcdelect.WithHandoverRecords(1)) })
}

func interopConcurrency(t *testing.T, opts ...etcdelect.Option) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	raw := newClient(t, endpoint)
	defer raw.Close()
	s1, err := concurrency.NewSession(raw, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(raw, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()

	// An etcdctl-style election holds the key first.
	el := concurrency.NewElection(s1, key)
	if err := el.Campaign(ctx, "etcdctl-elect"); err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, endpoint)
	defer cli.Close()
	e, err := election.New(etcdelect.New(cli, opts...), election.Config{Key: key, Identity: "tenure", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())

	l, err := e.Leader(ctx)
	if err != nil || l.Vacant || l.Term.Identity != "etcdctl-elect" {
		t.Fatalf("tenure sees leader %+v, %v; want etcdctl-elect", l, err)
	}
	if _, err := e.TryCampaign(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Fatalf("TryCampaign while concurrency.Election leads = %v, want ErrLocked", err)
	}
	got := make(chan tenure.Term, 1)
	go func() {
		term, err := e.Campaign(ctx)
		if err != nil {
			t.Errorf("Campaign: %v", err)
		}
		got <- term
	}()
	waitPos(t, e, 1)
	// An etcdctl-style mutex arrives after tenure and must wait behind it.
	mu := concurrency.NewMutex(s2, key)
	locked := make(chan struct{})
	go func() {
		if err := mu.Lock(ctx); err != nil {
			t.Errorf("Mutex.Lock: %v", err)
		}
		close(locked)
	}()
	waitFor(t, "the mutex to queue", func() bool {
		r, err := raw.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 3
	})
	select {
	case <-got:
		t.Fatal("tenure elected while concurrency.Election still leads")
	default:
	}
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	term := <-got
	if term.Token <= uint64(el.Rev()) {
		t.Fatalf("tenure's term %d not above the election's %d", term.Token, el.Rev())
	}
	select {
	case <-locked:
		t.Fatal("concurrency.Mutex locked while tenure leads")
	case <-time.After(200 * time.Millisecond):
	}
	// concurrency.Election observers see tenure's identity.
	if resp, err := el.Leader(ctx); err != nil || string(resp.Kvs[0].Value) != "tenure" {
		t.Fatalf("concurrency.Election.Leader = %v, %v; want tenure", resp, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-locked:
	case <-time.After(10 * time.Second):
		t.Fatal("concurrency.Mutex not locked after tenure resigned")
	}
	if err := mu.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func waitPos(t testing.TB, e *election.Elector, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("position %d", want), func() bool {
		n, err := e.Position(context.Background())
		return err == nil && n == want
	})
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestMaxTTL_IsTheServersLongestLease: the server grants a lease of
// MaxTTL and refuses one a second longer, so CheckTTL refuses exactly what
// the server would.
func TestMaxTTL_IsTheServersLongestLease(t *testing.T) {
	cli := newClient(t, endpoint)
	defer cli.Close()
	ctx := ctxT(t, 10*time.Second)
	g, err := cli.Grant(ctx, int64(etcdelect.MaxTTL/time.Second))
	if err != nil {
		t.Fatalf("grant of MaxTTL: %v", err)
	}
	if _, err := cli.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Grant(ctx, int64(etcdelect.MaxTTL/time.Second)+1); err == nil || !strings.Contains(err.Error(), "too large lease TTL") {
		t.Fatalf("grant of MaxTTL + 1s: %v; want too large lease TTL", err)
	}
}

// TestCheckTTL_RefusesWhatEtcdCannotHonour: TTLs that are not whole seconds
// of at least 1 s, and keys etcd cannot hold or tenure would misread, are
// refused before anything is sent.
func TestCheckTTL_RefusesWhatEtcdCannotHonour(t *testing.T) {
	b := etcdelect.New(nil)
	for _, ttl := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, -time.Second} {
		if err := b.CheckTTL(ttl); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("CheckTTL(%v) = %v, want ErrInvalidConfig", ttl, err)
		}
	}
	if err := b.CheckTTL(etcdelect.MaxTTL + time.Second); !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "longest lease") {
		t.Errorf("CheckTTL(MaxTTL + 1s) = %v, want ErrInvalidConfig (longest lease)", err)
	}
	for _, ttl := range []time.Duration{3 * time.Second, etcdelect.MaxTTL} {
		if err := b.CheckTTL(ttl); err != nil {
			t.Errorf("CheckTTL(%v) = %v", ttl, err)
		}
	}
	for _, key := range []string{"", "a\x00b", "a\nb", string([]byte{0xff}), string(make([]byte, etcdelect.MaxKeyLen+1))} {
		if err := b.CheckKey(key); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalidConfig", key, err)
		}
	}
}

// TestOpenSession_RefusesTTLBelowServerMinimum: a server whose minimum lease
// TTL is above the asked TTL (2 s with etcd's default timing) makes the
// campaign fail with ErrInvalidConfig, rather than silently lead with a
// longer TTL than configured, and revokes the lease it was granted.
func TestOpenSession_RefusesTTLBelowServerMinimum(t *testing.T) {
	slow, err := etcdembed.StartTimed(t.TempDir(), 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	cli := newClient(t, slow.Endpoint)
	defer cli.Close()
	ctx := ctxT(t, 30*time.Second)
	e, err := election.New(etcdelect.New(cli), election.Config{Key: electiontest.Key(t), Identity: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if _, err := e.Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "minimum lease TTL") {
		t.Fatalf("Campaign with TTL 1s on a server whose minimum is 2s = %v, want ErrInvalidConfig naming the minimum lease TTL", err)
	}
	if e.IsLeader() {
		t.Fatal("IsLeader after the refused campaign")
	}
	r, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Leases) != 0 {
		t.Fatalf("%d lease(s) after the refused campaign, want none (the granted lease revoked)", len(r.Leases))
	}
}
