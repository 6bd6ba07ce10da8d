package redislock_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/internal/redisserver"
	"github.com/tenure-go/tenure/internal/testpki"
	"github.com/tenure-go/tenure/redislock"
)

var (
	srv     *redisserver.Server
	baseDir string
)

// quiet drops go-redis's own log lines (dial failures are expected in
// tests that stop servers).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	dir, err := os.MkdirTemp("", "tenure-redis-")
	if err != nil {
		panic(err)
	}
	baseDir = dir
	srv, err = redisserver.Start(dir+"/main", redisserver.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
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

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func client(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { c.Close() })
	return c
}

func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// harness gives each backend its own client behind its own fault proxy, as
// a separate process would have.
type harness struct {
	mu      sync.Mutex
	proxies map[election.Backend]*faultproxy.Proxy
	clients map[election.Backend]*redis.Client
}

func (h *harness) newBackend(t testing.TB) election.Backend {
	p, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaintNotificationsConfig: noMaint()})
	b, err := redislock.New([]*redis.Client{c}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	h.proxies[b], h.clients[b] = p, c
	h.mu.Unlock()
	t.Cleanup(func() { c.Close(); p.Close() })
	return b
}

// newTestHarness returns a harness with no backends yet.
func newTestHarness() *harness {
	return &harness{proxies: map[election.Backend]*faultproxy.Proxy{}, clients: map[election.Backend]*redis.Client{}}
}

// openSession opens a session on b, closed at the end of the test.
func openSession(t *testing.T, ctx context.Context, b election.Backend, opts election.SessionOptions) election.Session {
	t.Helper()
	s, err := b.OpenSession(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	return s
}

func newHarness() electiontest.Harness {
	h := newTestHarness()
	return electiontest.Harness{
		TTL:        time.Second,
		NewBackend: h.newBackend,
		// A waiter wakes when the holder's key expires (it reads the key's
		// remaining TTL), plus one round trip.
		FailoverSlack: 300 * time.Millisecond,
		Unordered:     true,
		Crash: func(_ testing.TB, b election.Backend) {
			// A killed process's connection drops; its key is not deleted.
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
		// The key, as a restart without persistence loses it.
		DeleteEntry: func(t testing.TB, term tenure.Term) {
			if n, err := client(t, srv.Addr()).Del(context.Background(), term.Key).Result(); err != nil || n != 1 {
				t.Fatalf("DEL %s: %d, %v", term.Key, n, err)
			}
		},
	}
}

func TestConformance_Redis(t *testing.T) { electiontest.Run(t, newHarness()) }

// startMasters starts n Redis servers of their own for the test (stopped
// at its end) and returns them with a client each.
func startMasters(t *testing.T, n int) ([]*redisserver.Server, []*redis.Client) {
	t.Helper()
	var servers []*redisserver.Server
	var clients []*redis.Client
	for i := range n {
		s, err := redisserver.Start(fmt.Sprintf("%s/%s-%d", baseDir, t.Name(), i), redisserver.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		servers = append(servers, s)
		clients = append(clients, client(t, s.Addr()))
	}
	return servers, clients
}

// TestStaleReleaseDeletesNothing: a holder whose key expired (it was cut
// off) and was taken by another releases nothing of the new holder's.
func TestStaleReleaseDeletesNothing(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	ba := h.newBackend(t)
	opts := election.SessionOptions{TTL: 500 * time.Millisecond, RenewInterval: 150 * time.Millisecond}
	sa := openSession(t, ctx, ba, opts)
	ta, err := sa.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	if ta, err = sa.WaitHead(ctx, ta); err != nil {
		t.Fatal(err)
	}
	h.proxies[ba].Blackhole() // a's watchdog can no longer extend
	bb := h.newBackend(t)
	sb := openSession(t, ctx, bb, opts)
	tb, err := sb.Enqueue(ctx, key, "b")
	if err != nil {
		t.Fatal(err)
	}
	if tb, err = sb.WaitHead(ctx, tb); err != nil { // after a's key expired
		t.Fatal(err)
	}
	if tb.Token <= ta.Token {
		t.Fatalf("b's token %d is not above a's %d", tb.Token, ta.Token)
	}
	h.proxies[ba].Heal()
	if err := sa.Dequeue(ctx, ta); err != nil {
		t.Fatalf("stale release: %v", err)
	}
	l, err := bb.Leader(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l.Vacant || l.Term.Identity != "b" || l.Term.Token != tb.Token || !l.Term.Advisory {
		t.Fatalf("after a's stale release the leader is %+v, want b's advisory term %d", l, tb.Token)
	}
	// A stale extension does not extend b's key either: a's watchdog finds
	// the key someone else's and a's loss is reported.
	if err := sa.WatchLoss(ctx, ta); !errors.Is(err, tenure.ErrOwnershipLost) {
		t.Fatalf("a's WatchLoss = %v, want ErrOwnershipLost", err)
	}
}

// TestWatchdogKeepsLongJob: a job that runs three times its TTL keeps the
// lock; a waiter enters only after the job returns.
func TestWatchdogKeepsLongJob(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	h := newHarness()
	key := electiontest.Key(t)
	const ttl = time.Second
	holder, _ := h.NewElector(t, key, "holder")
	waiter, _ := h.NewElector(t, key, "waiter")
	elected := make(chan struct{})
	var jobEnd time.Time
	var mu sync.Mutex
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	runErr := make(chan error, 1)
	go func() {
		runErr <- holder.Run(runCtx, tenure.Callbacks{OnElected: func(lctx context.Context, _ tenure.Term) {
			close(elected)
			select {
			case <-time.After(3 * ttl):
			case <-lctx.Done():
				t.Errorf("the job lost its lock while running: %v", context.Cause(lctx))
			}
			mu.Lock()
			jobEnd = time.Now()
			mu.Unlock()
			stop() // one job, then resign
		}})
	}()
	<-elected
	if _, err := waiter.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	entered := time.Now()
	mu.Lock()
	end := jobEnd
	mu.Unlock()
	if end.IsZero() || entered.Before(end) {
		t.Fatalf("the waiter entered at %v, before the job ended (%v)", entered, end)
	}
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("waiter entered %v after the %v job ended", entered.Sub(end), 3*ttl)
}

// TestRedlockQuorum: with five masters, two stopped, the lock is granted;
// with three stopped, campaigning fails with an error naming the quorum and
// the masters that failed.
func TestRedlockQuorum(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	servers, clients := startMasters(t, 5)
	b, err := redislock.New(clients, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := electiontest.Key(t)
	cfg := election.Config{Key: key, Identity: "a", TTL: 2 * time.Second}
	servers[0].Kill()
	servers[3].Kill()
	e, err := election.New(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with 3 of 5 masters: %v", err)
	}
	if !term.Advisory || term.Token == 0 {
		t.Fatalf("term %+v: want an advisory term with a token", term)
	}
	// The key is on the three live masters, with a's value.
	for _, i := range []int{1, 2, 4} {
		v, err := clients[i].Get(ctx, key).Result()
		if err != nil || !strings.HasSuffix(v, " a") {
			t.Fatalf("master %d: %q, %v; want a's value", i, v, err)
		}
	}
	if err := e.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{1, 2, 4} {
		if n, err := clients[i].Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Fatalf("master %d still has the key after Close (%d, %v)", i, n, err)
		}
	}

	servers[1].Kill()
	e2, err := election.New(b, election.Config{Key: key, Identity: "b", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close(context.Background())
	_, err = e2.Campaign(ctx)
	if !errors.Is(err, tenure.ErrUnavailable) {
		t.Fatalf("Campaign with 2 of 5 masters = %v, want ErrUnavailable", err)
	}
	msg := err.Error()
	for _, want := range []string{"quorum is 3", servers[0].Addr(), servers[1].Addr(), servers[3].Addr()} {
		if !strings.Contains(msg, want) {
			t.Errorf("quorum error %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, servers[2].Addr()) {
		t.Errorf("quorum error %q names a live master", msg)
	}
	t.Logf("quorum error: %v", err)
}

// TestForeignValue: a key that another client wrote is held by an unknown
// holder; tenure neither deletes nor extends it, and waits for it.
func TestForeignValue(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	h := newHarness()
	key := electiontest.Key(t)
	raw := client(t, srv.Addr())
	const foreignTTL = 700 * time.Millisecond
	set := time.Now() // the value expires no earlier than foreignTTL from here
	if err := raw.Set(ctx, key, "not tenure's \x00\xff", foreignTTL).Err(); err != nil {
		t.Fatal(err)
	}
	e, b := h.NewElector(t, key, "a")
	l, err := b.Leader(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if l.Vacant || l.Term.Token != 0 || l.Term.Identity != "" {
		t.Fatalf("Leader over a foreign value = %+v, want held by an unknown holder", l)
	}
	if _, err := e.TryCampaign(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Fatalf("TryCampaign over a foreign value = %v, want ErrLocked", err)
	}
	if v, err := raw.Get(ctx, key).Result(); err != nil || v != "not tenure's \x00\xff" {
		t.Fatalf("the foreign value became %q, %v", v, err)
	}
	if ttl, err := raw.PTTL(ctx, key).Result(); err != nil || ttl <= 0 || ttl > foreignTTL {
		t.Fatalf("the foreign value's TTL is %v, %v after TryCampaign; want its own, at most %v (not extended)", ttl, err, foreignTTL)
	}
	// It expires; then tenure takes the key.
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(set); waited < foreignTTL {
		t.Fatalf("elected %v after the foreign value was set, before its %v expiry: tenure did not wait for it", waited, foreignTTL)
	}
}

// TestMutexAndFencesRefuseRedis: APIs that need a linearizable lock refuse
// the backend with a clear error.
func TestMutexAndFencesRefuseRedis(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	h := newHarness()
	key := electiontest.Key(t)
	b := h.NewBackend(t)
	if _, err := election.NewMutex(b, election.Config{Key: key, Identity: "a"}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("NewMutex on redis = %v, want ErrInvalidConfig", err)
	}
	e, _ := h.NewElector(t, key, "a")
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var g fence.Guard
	if err := g.CheckTerm("report", term); !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "efficiency-only") {
		t.Fatalf("Guard.CheckTerm(redis term) = %v, want a refusal", err)
	}
}

// TestBadInput: invalid keys, TTLs, endpoints and options give clear errors.
func TestBadInput(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	for _, key := range []string{"", "a b", "x\n", "report:fence", "jobs:waiting", "jobs:gone:1f2e", strings.Repeat("k", redislock.MaxKeyLen+1), "\xff"} {
		if err := redislock.CheckKey(key); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalidConfig", key, err)
		}
	}
	b, err := redislock.New([]*redis.Client{client(t, srv.Addr())}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ttl := range []time.Duration{0, 50 * time.Millisecond, 1500 * time.Microsecond, 25 * time.Hour} {
		if err := b.CheckTTL(ttl); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("CheckTTL(%v) = %v, want ErrInvalidConfig", ttl, err)
		}
	}
	if _, err := redislock.New(nil, redislock.Options{}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("New(no masters) = %v", err)
	}
	if _, err := redislock.New([]*redis.Client{client(t, srv.Addr())}, redislock.Options{DriftFactor: 0.7}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("New(DriftFactor 0.7) = %v", err)
	}
	if _, err := redislock.New([]*redis.Client{client(t, srv.Addr())}, redislock.Options{DriftFactor: math.NaN()}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("New(DriftFactor NaN) = %v", err) // every validity came out negative
	}
	// One server twice, as one client or two: one server's two votes
	// (Dial refused it; New gave it a quorum on its own).
	c := client(t, srv.Addr())
	for _, ms := range [][]*redis.Client{{c, c}, {c, client(t, srv.Addr())}} {
		if _, err := redislock.New(ms, redislock.Options{}); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("New with one server twice = %v, want ErrInvalidConfig", err)
		}
	}
	// A zero Backend, and a closed one, are refused, not retried as an
	// unavailable server.
	if _, err := election.New(&redislock.Backend{}, election.Config{Key: "k", TTL: 2 * time.Second}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("election.New on a zero Backend = %v, want ErrInvalidConfig", err)
	}
	closed, err := redislock.New([]*redis.Client{client(t, srv.Addr())}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := election.New(closed, election.Config{Key: "k", TTL: 2 * time.Second}); !errors.Is(err, tenure.ErrClosed) {
		t.Errorf("election.New on a closed Backend = %v, want ErrClosed", err)
	}
	if _, err := closed.Leader(ctx, "k"); !errors.Is(err, tenure.ErrClosed) {
		t.Errorf("Leader on a closed Backend = %v, want ErrClosed", err)
	}
	// The same server twice under two names: one server's two votes.
	_, port, _ := strings.Cut(srv.Addr(), ":")
	for _, eps := range [][]string{nil, {"nohost"}, {"h:0"}, {"h:99999"}, {srv.Addr(), srv.Addr()}, {srv.Addr(), "localhost:" + port, "127.0.0.2:1"}} {
		if _, err := redislock.Dial(ctx, eps, nil, redislock.Options{}); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("Dial(%q) = %v, want ErrInvalidConfig", eps, err)
		}
	}
	// A closed port: unavailable, named.
	dead, err := redisserver.Start(baseDir+"/dead", redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	_, err = redislock.Dial(ctx, []string{dead.Addr()}, &redis.Options{DialTimeout: 300 * time.Millisecond, MaxRetries: -1}, redislock.Options{})
	if !errors.Is(err, tenure.ErrUnavailable) || !strings.Contains(err.Error(), dead.Addr()) {
		t.Errorf("Dial(closed port) = %v, want ErrUnavailable naming %s", err, dead.Addr())
	}
}

// TestDial_OneDialAttemptUnlessBaseSaysMore: with one master of three
// down, each read that needs its answer dials it once, not go-redis's
// default five times 100 ms apart; base's own DialerRetries is kept. The
// dials are counted by base's Dialer.
func TestDial_OneDialAttemptUnlessBaseSaysMore(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, _ := startMasters(t, 2)
	dead, err := redisserver.Start(baseDir+"/"+t.Name()+"-dead", redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dead.Close()
	addrs := []string{servers[0].Addr(), servers[1].Addr(), dead.Addr()}
	for _, c := range []struct {
		retries, want int
	}{{0, 1}, {3, 3}} {
		var dials atomic.Int64
		d := &net.Dialer{Timeout: time.Second}
		base := &redis.Options{
			MaxRetries:    -1,
			DialerRetries: c.retries,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == dead.Addr() {
					dials.Add(1)
				}
				return d.DialContext(ctx, network, addr)
			},
		}
		b, err := redislock.Dial(ctx, addrs, base, redislock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		const reads = 5 // under the pool's PoolSize: go-redis stops dialing a master after that many failed dials
		for range reads {
			if _, err := b.Leader(ctx, "dial-count"); err != nil {
				t.Fatal(err)
			}
		}
		b.Close()
		// Dial's PING and each read dial the dead master once each.
		if got, want := dials.Load(), int64((reads+1)*c.want); got != want {
			t.Errorf("DialerRetries %d: %d dial attempts at the dead master for %d reads and a PING, want %d", c.retries, got, reads, want)
		}
	}
}

// TestDial_SocketDeadlinesFollowMasterTimeout: Dial's clients take their
// socket deadlines from each call's ctx, so that a call to a master that
// does not answer ends at Options.MasterTimeout, as fanOut gives up on it,
// not at the client's ReadTimeout (5 s by default) with its connection
// held until then. The read deadlines are recorded by base's Dialer.
func TestDial_SocketDeadlinesFollowMasterTimeout(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, _ := startMasters(t, 3)
	var mu sync.Mutex
	var longest time.Duration // the furthest read deadline set, from when it was set
	d := &net.Dialer{Timeout: time.Second}
	base := &redis.Options{
		MaxRetries: -1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return deadlineConn{c, func(at time.Time) {
				if at.IsZero() {
					return
				}
				mu.Lock()
				longest = max(longest, time.Until(at))
				mu.Unlock()
			}}, nil
		},
	}
	const per = 200 * time.Millisecond
	b, err := redislock.Dial(ctx, []string{servers[0].Addr(), servers[1].Addr(), servers[2].Addr()}, base, redislock.Options{MasterTimeout: per})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mu.Lock()
	longest = 0 // Dial's PING is bounded by ctx
	mu.Unlock()
	for range 5 {
		if _, err := b.Leader(ctx, "deadline"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	got := longest
	mu.Unlock()
	if got <= 0 || got > per {
		t.Fatalf("the furthest read deadline of a Leader read was %v after it was set, want within MasterTimeout %v (ReadTimeout is 5 s)", got, per)
	}
}

// deadlineConn tells read of every read deadline set on its conn.
type deadlineConn struct {
	net.Conn
	read func(time.Time)
}

func (c deadlineConn) SetReadDeadline(at time.Time) error {
	c.read(at)
	return c.Conn.SetReadDeadline(at)
}

func (c deadlineConn) SetDeadline(at time.Time) error {
	c.read(at)
	return c.Conn.SetDeadline(at)
}

// TestAuth: a server with requirepass refuses a client without the
// password (a clear error, nothing written) and serves one with it.
func TestAuth(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s, err := redisserver.Start(baseDir+"/auth", redisserver.Options{Password: "s3cret-pw"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = redislock.Dial(ctx, []string{s.Addr()}, &redis.Options{MaxRetries: -1}, redislock.Options{})
	if !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("Dial without the password = %v, want ErrInvalidConfig with NOAUTH", err)
	}
	_, err = redislock.Dial(ctx, []string{s.Addr()}, &redis.Options{Username: "default", Password: "wrong", MaxRetries: -1}, redislock.Options{})
	if err == nil || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("Dial with a wrong password = %v, want an error that does not echo the password", err)
	}
	b, err := redislock.Dial(ctx, []string{s.Addr()}, &redis.Options{Username: "default", Password: "s3cret-pw"}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e, err := election.New(b, election.Config{Key: "auth-test", Identity: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatalf("Campaign with the password: %v", err)
	}
	// Another client without the password can neither read nor delete it.
	raw := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, MaintNotificationsConfig: noMaint()})
	defer raw.Close()
	if err := raw.Del(ctx, "auth-test").Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("DEL without the password = %v, want NOAUTH", err)
	}
	if !e.IsLeader() {
		t.Fatal("leadership lost")
	}
}

// TestTLS: a TLS-only server refuses plain TCP and serves a client that
// trusts its CA.
func TestTLS(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	ca, err := testpki.NewCA(t.TempDir(), "redis-test")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server("redis")
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisserver.Start(baseDir+"/tls", redisserver.Options{TLS: &redisserver.TLS{CertFile: pair.CertFile, KeyFile: pair.KeyFile, CAFile: ca.CertFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	plain := &redis.Options{MaxRetries: -1, DialTimeout: 500 * time.Millisecond, ReadTimeout: 500 * time.Millisecond}
	if _, err := redislock.Dial(ctx, []string{s.Addr()}, plain, redislock.Options{}); !errors.Is(err, tenure.ErrUnavailable) {
		t.Fatalf("plain TCP to a TLS server = %v, want ErrUnavailable", err)
	}
	pem, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	// A client that does not trust the CA refuses the server.
	untrusted := &redis.Options{MaxRetries: -1, TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	if _, err := redislock.Dial(ctx, []string{s.Addr()}, untrusted, redislock.Options{}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without the CA = %v, want a certificate error", err)
	}
	b, err := redislock.Dial(ctx, []string{s.Addr()}, &redis.Options{TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	e, err := election.New(b, election.Config{Key: "tls-test", Identity: "a", TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatalf("Campaign over TLS: %v", err)
	}
}

// TestACLUser: the ACL user docs/security.md documents can campaign on its
// own keys and nothing else.
func TestACLUser(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	admin := client(t, srv.Addr())
	acl := strings.Fields(`ACL SETUSER report on >pw-report resetkeys ~report:* resetchannels &tenure:report:* -@all +get +set +del +incr +pexpire +pttl +publish +subscribe +unsubscribe +zadd +zrem +zrange +zremrangebyscore +time +ping +eval +evalsha +script|load`)
	args := make([]any, len(acl))
	for i, a := range acl {
		args[i] = a
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	defer admin.Do(context.Background(), "ACL", "DELUSER", "report")
	b, err := redislock.Dial(ctx, []string{srv.Addr()}, &redis.Options{Username: "report", Password: "pw-report", MaxRetries: -1}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	newE := func(key, id string) *election.Elector {
		e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
	a, w := newE("report:hourly", "a"), newE("report:hourly", "b")
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatalf("Campaign on the user's own key: %v", err)
	}
	got := make(chan error, 1)
	go func() { _, err := w.Campaign(ctx); got <- err }()
	time.Sleep(100 * time.Millisecond) // b waits on the channel
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter after a resign: %v", err)
	}
	if _, err := newE("billing", "c").TryCampaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("TryCampaign on another service's key = %v, want ErrInvalidConfig with NOPERM", err)
	}
	// A waiting campaign fails at once too, instead of retrying.
	start := time.Now()
	if _, err := newE("billing", "d").Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) || time.Since(start) > 2*time.Second {
		t.Fatalf("Campaign on another service's key = %v after %v, want ErrInvalidConfig at once", err, time.Since(start))
	}
}

// TestReleaseWakesOneWaiter: a release wakes one of the waiting
// candidates, not all of them: with 20 waiters, a handoff costs a handful
// of commands on the server, not one try per waiter.
func TestReleaseWakesOneWaiter(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	h := newHarness()
	key := electiontest.Key(t)
	const waiters, handoffs = 20, 10
	admin := client(t, srv.Addr())
	var es []*election.Elector
	for i := range waiters + 1 {
		e, _ := h.NewElector(t, key, fmt.Sprintf("c%d", i))
		es = append(es, e)
	}
	if _, err := es[0].Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	won := make(chan int, waiters)
	for i := 1; i <= waiters; i++ {
		go func() {
			if _, err := es[i].Campaign(ctx); err == nil {
				won <- i
			}
		}()
	}
	// Every waiter has tried once and is registered.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := admin.ZCard(ctx, key+":waiting").Result()
		if err == nil && n == waiters {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters registered, want %d (%v)", n, waiters, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	calls := func() int64 { return scriptCalls(t, ctx, admin) }
	before := calls()
	holder := es[0]
	for range handoffs {
		if err := holder.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case i := <-won:
			holder = es[i]
		case <-time.After(5 * time.Second):
			t.Fatal("no waiter elected within 5 s of a release")
		}
	}
	per := float64(calls()-before) / handoffs
	t.Logf("scripts per handoff with %d waiters: %.1f", waiters, per)
	// One release and one acquire, plus the waiters' watchdog rounds
	// (each renews its waiting entry every TTL/3) and a woken waiter that
	// loses a race now and then. Waking every waiter cost 21 or more.
	if per > 6 {
		t.Fatalf("%.1f scripts per handoff with %d waiters: a release woke more than one", per, waiters)
	}
	// Each handoff runs at least the release and the acquire: fewer means
	// the count above no longer sees tenure's scripts, and shows nothing.
	if per < 2 {
		t.Fatalf("%.1f scripts per handoff: the server's command stats miss tenure's scripts", per)
	}
}

// TestServerRestartDemotesHolder: a Redis restart loses every key
// (persistence off here); the holder's watchdog finds its key gone and the
// holder is demoted within a few renewals, while a waiter takes the key.
func TestServerRestartDemotesHolder(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	s, err := redisserver.Start(baseDir+"/restart", redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	newE := func(id string) *election.Elector {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 300 * time.Millisecond,
			ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaintNotificationsConfig: noMaint()})
		t.Cleanup(func() { c.Close() })
		b, err := redislock.New([]*redis.Client{c}, redislock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := election.New(b, election.Config{Key: "restart", Identity: id, TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
	a, w := newE("a"), newE("w")
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { _, err := w.Campaign(ctx); got <- err }()
	time.Sleep(200 * time.Millisecond)
	s.Kill()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	select {
	case <-a.Done():
		t.Logf("holder demoted %v after the restart: %v", time.Since(restarted), a.Err())
		if !errors.Is(a.Err(), tenure.ErrOwnershipLost) {
			t.Errorf("holder demoted with %v, want ErrOwnershipLost (its watchdog finds the key gone)", a.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("holder still leads 5 s after a restart that lost its key (IsLeader %v)", a.IsLeader())
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter's Campaign after the restart: %v", err)
		}
		t.Logf("waiter elected %v after the restart", time.Since(restarted))
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not elected within 5 s of the restart")
	}
	if !w.IsLeader() {
		t.Fatalf("the waiter does not lead after its Campaign returned: %v", w.Err())
	}
}

// TestEntryOfEndedTermIsNotReused: a session whose term ended without a
// release (at a lease deadline, the key still its own) hands the entry back
// with the token it drew, so the elector deletes it and campaigns anew (a
// new term must get a larger token); and an entry the watchdog found lost
// is spent: its ticket fails instead of taking the key again.
func TestEntryOfEndedTermIsNotReused(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	b := h.newBackend(t)
	s := openSession(t, ctx, b, election.SessionOptions{TTL: time.Second, RenewInterval: 100 * time.Millisecond})
	t0, err := s.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.WaitHead(ctx, t0)
	if err != nil || held.Token == 0 {
		t.Fatalf("WaitHead = %+v, %v", held, err)
	}
	again, err := s.Enqueue(ctx, key, "a")
	if err != nil || again.Name != held.Name || again.Token != held.Token {
		t.Fatalf("Enqueue while the entry holds = %+v, %v; want its ticket with token %d", again, err, held.Token)
	}
	if err := s.Dequeue(ctx, again); err != nil {
		t.Fatal(err)
	}
	fresh, err := s.Enqueue(ctx, key, "a")
	if err != nil || fresh.Name == held.Name || fresh.Token != 0 {
		t.Fatalf("Enqueue after Dequeue = %+v, %v; want a new entry without a token", fresh, err)
	}
	next, err := s.WaitHead(ctx, fresh)
	if err != nil || next.Token <= held.Token {
		t.Fatalf("the new entry's WaitHead = %+v, %v; want a token above %d", next, err, held.Token)
	}

	// The key goes behind the holder's back: the watchdog finds it lost.
	if err := client(t, srv.Addr()).Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.WatchLoss(ctx, next); !errors.Is(err, tenure.ErrOwnershipLost) {
		t.Fatalf("WatchLoss = %v, want ErrOwnershipLost", err)
	}
	if got, err := s.WaitHead(ctx, next); !errors.Is(err, tenure.ErrOwnershipLost) {
		t.Fatalf("WaitHead on the lost ticket = %+v, %v; want ErrOwnershipLost", got, err)
	}
	if n, err := client(t, srv.Addr()).Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("the lost ticket's WaitHead took the key again (EXISTS %d, %v)", n, err)
	}
}

// TestCancelledTryTakesNothing: a try made with a context that has already
// ended (WaitHead woken as its campaign is cancelled, Ahead from Position
// with an expired context) returns the context's error and sends nothing:
// no key taken, no token drawn, no waiting entry. (The calls to the
// masters run on a context without the caller's cancellation, so that a
// release given up on still lands: a try sent then would take the key for
// nobody until the campaign's clean-up.)
func TestCancelledTryTakesNothing(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	b := h.newBackend(t)
	s := openSession(t, ctx, b, election.SessionOptions{TTL: 2 * time.Second, RenewInterval: 600 * time.Millisecond})
	tk, err := s.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Ahead(cctx, tk); !errors.Is(err, context.Canceled) {
		t.Errorf("Ahead with an ended context = %v, want context.Canceled", err)
	}
	if _, err := s.WaitHead(cctx, tk); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitHead with an ended context = %v, want context.Canceled", err)
	}
	c := client(t, srv.Addr())
	for _, k := range []string{key, key + ":fence", key + ":waiting"} {
		if n, err := c.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("%s exists (%d, %v) after tries with an ended context", k, n, err)
		}
	}
	// The entry still campaigns as usual.
	if tk, err = s.WaitHead(ctx, tk); err != nil || tk.Token != 1 {
		t.Fatalf("WaitHead = %+v, %v; want the key with token 1", tk, err)
	}
	if err := s.Dequeue(ctx, tk); err != nil {
		t.Fatal(err)
	}
}

// TestClosedClient_IsErrClosed: a client the caller closed (or too many
// of the masters' clients) will never answer again. Before, its
// "redis: client is closed" was reported as ErrUnavailable, and Run
// retried it for as long as its ctx lived.
func TestClosedClient_IsErrClosed(t *testing.T) {
	c := client(t, srv.Addr())
	b, err := redislock.New([]*redis.Client{c}, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := electiontest.Key(t)
	e, err := election.New(b, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	c.Close()
	ctx := ctxT(t, 10*time.Second)
	if _, err := b.Leader(ctx, key); !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("Leader on a closed client: %v, want ErrClosed", err)
	}
	begun := time.Now()
	err = e.Run(ctx, tenure.Callbacks{})
	t.Logf("Run on a closed client: %v after %v", err, time.Since(begun))
	if !errors.Is(err, tenure.ErrClosed) || time.Since(begun) > 2*time.Second {
		t.Fatalf("Run on a closed client: %v after %v, want ErrClosed at once", err, time.Since(begun))
	}
	// With three masters, one closed client leaves a quorum: that is no
	// reason to stop.
	var cs []*redis.Client
	for range 3 {
		p, err := faultproxy.New(srv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		cs = append(cs, client(t, p.Addr()))
	}
	b3, err := redislock.New(cs, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs[0].Close()
	if _, err := b3.Leader(ctx, key); err != nil {
		t.Errorf("Leader with one of three clients closed: %v, want an answer", err)
	}
	cs[1].Close()
	if _, err := b3.Leader(ctx, key); !errors.Is(err, tenure.ErrClosed) {
		t.Errorf("Leader with two of three clients closed: %v, want ErrClosed", err)
	}
}
