package test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
)

// contender is one candidate of an election implementation, on its own etcd
// client (as a separate process would be).
type contender interface {
	// campaign blocks until the contender holds the key.
	campaign(ctx context.Context) error
	// resign releases the key; the next contender in the queue takes it.
	resign(ctx context.Context) error
	// close releases everything the contender holds (not the client).
	close(ctx context.Context) error
}

// impl builds the contender with index i for key on cli (nil for
// contenders that are separate processes, proc).
type impl struct {
	name string
	new  func(cli *clientv3.Client, key string, i int) (contender, error)
	proc bool
}

var impls = []impl{
	{name: "tenure", new: newTenure},
	{name: "etcd-election", new: newRaw},
	{name: "etcd-mutex", new: newRawMutex},
	{name: "etcdctl-lock", new: newEtcdctl, proc: true},
}

// tenureContender campaigns with tenure's election.Elector on the etcd
// backend.
type tenureContender struct{ e *election.Elector }

func newTenure(cli *clientv3.Client, key string, i int) (contender, error) {
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: fmt.Sprint(i), TTL: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	return tenureContender{e}, nil
}

func (c tenureContender) campaign(ctx context.Context) error {
	_, err := c.e.Campaign(ctx)
	return err
}
func (c tenureContender) resign(ctx context.Context) error { return c.e.Resign(ctx) }
func (c tenureContender) close(ctx context.Context) error  { return c.e.Close(ctx) }

// rawContender campaigns with go.etcd.io/etcd/client/v3/concurrency.Election.
type rawContender struct {
	sess *concurrency.Session
	el   *concurrency.Election
	val  string
}

func newRaw(cli *clientv3.Client, key string, i int) (contender, error) {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		return nil, err
	}
	return &rawContender{sess: sess, el: concurrency.NewElection(sess, key), val: fmt.Sprint(i)}, nil
}

func (c *rawContender) campaign(ctx context.Context) error { return c.el.Campaign(ctx, c.val) }
func (c *rawContender) resign(ctx context.Context) error   { return c.el.Resign(ctx) }
func (c *rawContender) close(context.Context) error        { return c.sess.Close() } // revokes the lease

// rawMutex locks with go.etcd.io/etcd/client/v3/concurrency.Mutex.
type rawMutex struct {
	sess *concurrency.Session
	m    *concurrency.Mutex
}

func newRawMutex(cli *clientv3.Client, key string, _ int) (contender, error) {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		return nil, err
	}
	return &rawMutex{sess: sess, m: concurrency.NewMutex(sess, key)}, nil
}

func (c *rawMutex) campaign(ctx context.Context) error { return c.m.Lock(ctx) }
func (c *rawMutex) resign(ctx context.Context) error   { return c.m.Unlock(ctx) }
func (c *rawMutex) close(context.Context) error        { return c.sess.Close() }

func newClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

var keySeq atomic.Int64

// BenchmarkHandoff measures leadership handoff latency: the time from the
// moment a holder decides to release (just before it calls Resign) until
// the next holder's Campaign returns. N contenders, each on its own client,
// loop Campaign → Resign → Campaign, so each resigner joins the back of the
// queue and the queue stays N long. One op is one handoff; the sub-benchmark
// stops after b.N of them.
//
// Metrics: p50-ms and p99-ms are nearest-rank percentiles of the b.N
// recorded handoff latencies; handoffs/s is b.N over the wall time from the
// first release to the last acquisition. ns/op is left as the testing
// package computes it: the timed wall time per handoff, i.e. about
// 1e9 / handoffs/s (it includes nothing but the handoffs and the trivial
// bookkeeping between them).
//
// Implementations: tenure (etcdelect + election.Elector), etcd's own
// concurrency.Election and concurrency.Mutex, and `etcdctl lock` (one
// etcdctl process per acquisition, see etcdctl_test.go).
//
// Cost metrics: etcd-reqs/handoff is the requests the server received
// during the timed handoffs (unary calls plus watch-stream messages; lease
// keep-alives left out) per handoff; heap-KB/candidate and
// goroutines/candidate are what each idle candidate adds to this process
// (client, session and the server's state for it included), rss-KB/candidate
// the resident set of each etcdctl process. wal-fsyncs/handoff is the
// server's WAL fsyncs over the timed handoffs, per handoff, and
// wal-fsync-over-2ms the share of them that took over 2 ms (from etcd's
// etcd_disk_wal_fsync_duration_seconds): whether the disk makes the tail.
//
// All implementations run on the same embedded etcd server, back to back
// for each N (-bench.contenders), in -bench.repeat interleaved rounds.
func BenchmarkHandoff(b *testing.B) {
	for _, n := range contenderCounts(b) {
		interleaved(b, n, impls, func(im impl) string { return im.name }, func(b *testing.B, im impl) { benchHandoff(b, im, n) })
	}
}

// handoffState is shared by the contenders of one run.
type handoffState struct {
	mu          sync.Mutex
	release     time.Time // when the latest holder decided to release
	releaser    int       // that holder's index
	haveRelease bool
	lats        []time.Duration
	handoffs    int
	first, last time.Time     // first release, last acquisition
	held        time.Duration // untimed holds (handoffLoop.hold) between first and last

	holders  atomic.Int32  // contenders between Campaign's return and Resign: must stay ≤ 1
	acquired chan struct{} // closed and replaced at every acquisition (guarded by mu)
}

func benchHandoff(b *testing.B, im impl, n int) {
	key := fmt.Sprintf("/tenure-bench/handoff/%s/%d/%d", im.name, n, keySeq.Add(1))
	count := timedCount(b, n)
	if im.proc {
		if _, err := etcdctlBinary(); err != nil {
			b.Fatal(err) // a peer that cannot be built must not drop out of the report unseen
		}
		if n > maxEtcdctlContenders {
			b.Skipf("not feasible: %d etcdctl processes (one per contender, ~%d MB resident each) on this machine; measured up to %d", n, etcdctlRSSMB, maxEtcdctlContenders)
		}
	}
	// Bound the run: a stuck queue fails the benchmark instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(n)*50*time.Millisecond+time.Duration(count)*time.Second)
	defer cancel()

	admin, err := newClient()
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()

	clis := make([]*clientv3.Client, 0, n)
	cons := make([]contender, 0, n)
	defer func() {
		// Close contenders (revoking their leases) and then their clients,
		// in parallel: with 100 contenders this is otherwise slow.
		var wg sync.WaitGroup
		for i := range max(len(clis), len(cons)) {
			wg.Go(func() {
				if i < len(cons) && cons[i] != nil {
					cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := cons[i].close(cctx); err != nil {
						b.Errorf("close contender %d: %v", i, err)
					}
					ccancel()
				}
				if i < len(clis) && clis[i] != nil {
					clis[i].Close()
				}
			})
		}
		wg.Wait()
	}()
	var mem memCost
	mem.mark(n)
	if im.proc {
		// Nothing to create up front: each campaign starts a process.
		for i := range n {
			c, err := im.new(nil, key, i)
			if err != nil {
				b.Fatal(err)
			}
			cons = append(cons, c)
		}
	} else {
		// Clients and sessions in parallel (a few at a time): at 1,000
		// contenders one after the other is slow.
		clis = make([]*clientv3.Client, n)
		cons = make([]contender, n)
		errs := make([]error, n)
		sem := make(chan struct{}, 16)
		var wg sync.WaitGroup
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				cli, err := newClient()
				if err != nil {
					errs[i] = err
					return
				}
				clis[i] = cli
				cons[i], errs[i] = im.new(cli, key, i)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			b.Fatal(err)
		}
	}

	countQueue := func(ctx context.Context) (int, error) {
		r, err := admin.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return int(r.Count), nil
	}
	var polls atomic.Int64
	fsyncs := fsyncMeter{n: count}
	reqs := serverRequests{read: etcdServerRequests, byKind: etcdRequestsByMethod, unit: "etcd-reqs/handoff", n: count,
		extra: func() float64 { return float64(polls.Load()) }}
	loop := handoffLoop{
		cons:   cons,
		count:  count,
		queued: func() (int, error) { return countQueue(ctx) },
		dump:   func(state []atomic.Int32) string { return dumpQueue(admin, key, state) },
		queuedHook: func() []metric {
			if im.proc {
				return procRSS(cons)
			}
			return mem.measure()
		},
		begin: func(b *testing.B) { polls.Store(0); reqs.begin(b); fsyncs.begin(b) },
		end:   func(b *testing.B) { reqs.report(b); fsyncs.report(b) },
	}
	if im.proc && n > 1 {
		// A releaser re-queues by starting a new etcdctl: hold until
		// someone else waits, so that no handoff times a process start.
		loop.holdUntil = func(ctx context.Context) error {
			for {
				polls.Add(1)
				q, err := countQueue(ctx)
				if err != nil || q >= 2 {
					return err
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	loop.run(b, ctx, cancel)
}

// stallTimeout fails a run in which no handoff happens for this long: far
// above any healthy handoff, and about the contenders' session TTL.
const stallTimeout = 10 * time.Second

const (
	stCampaigning = iota
	stHolding
	stResigning
)

func (st *handoffState) count() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.handoffs
}

// awaitFinished waits for finished, and reports false when ctx ends or no
// handoff is recorded for stallTimeout.
func awaitFinished(ctx context.Context, st *handoffState, finished <-chan struct{}) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last, since := st.count(), time.Now()
	for {
		select {
		case <-finished:
			return ctx.Err() == nil
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
		if c := st.count(); c != last {
			last, since = c, time.Now()
		} else if time.Since(since) > stallTimeout {
			return false
		}
	}
}

// dumpQueue describes the queue under key and what each contender is doing,
// for a stalled run.
func dumpQueue(admin *clientv3.Client, key string, state []atomic.Int32) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []byte
	resp, err := admin.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return fmt.Sprintf("reading the queue: %v", err)
	}
	out = fmt.Appendf(out, "queue at revision %d (oldest first):\n", resp.Header.Revision)
	for _, kv := range resp.Kvs {
		out = fmt.Appendf(out, "  %s create=%d mod=%d lease=%x value=%q\n", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Lease, kv.Value)
	}
	names := [...]string{stCampaigning: "campaigning", stHolding: "holding", stResigning: "resigning"}
	for i := range state {
		out = fmt.Appendf(out, "  contender %d: %s\n", i, names[state[i].Load()])
	}
	return string(out)
}

// nearestRank returns the p-th percentile of sorted by the nearest-rank
// method: the smallest value with at least p% of the values at or below it.
func nearestRank(sorted []time.Duration, p float64) time.Duration {
	r := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[max(r, 1)-1]
}
