package test

import (
	"context"
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

// impl builds the contender with index i for key on cli.
type impl struct {
	name string
	new  func(cli *clientv3.Client, key string, i int) (contender, error)
}

var impls = []impl{
	{"tenure", newTenure},
	{"etcd-concurrency", newRaw},
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
// Both implementations run on the same embedded etcd server, back to back
// for each N.
func BenchmarkHandoff(b *testing.B) {
	for _, n := range []int{2, 10, 100} {
		for _, im := range impls {
			b.Run(fmt.Sprintf("impl=%s/contenders=%d", im.name, n), func(b *testing.B) {
				benchHandoff(b, im, n)
			})
		}
	}
}

// handoffState is shared by the contenders of one run.
type handoffState struct {
	mu          sync.Mutex
	release     time.Time // when the latest holder decided to release
	haveRelease bool
	lats        []time.Duration
	handoffs    int
	first, last time.Time // first release, last acquisition

	holders  atomic.Int32  // contenders between Campaign's return and Resign: must stay ≤ 1
	acquired chan struct{} // closed and replaced at every acquisition (guarded by mu)
}

func benchHandoff(b *testing.B, im impl, n int) {
	key := fmt.Sprintf("/tenure-bench/handoff/%s/%d/%d", im.name, n, keySeq.Add(1))
	// Bound the run: a stuck queue fails the benchmark instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(b.N)*time.Second)
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
		for i := range clis {
			wg.Go(func() {
				if i < len(cons) {
					cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := cons[i].close(cctx); err != nil {
						b.Errorf("close contender %d: %v", i, err)
					}
					ccancel()
				}
				clis[i].Close()
			})
		}
		wg.Wait()
	}()
	for i := range n {
		cli, err := newClient()
		if err != nil {
			b.Fatal(err)
		}
		clis = append(clis, cli)
		c, err := im.new(cli, key, i)
		if err != nil {
			b.Fatal(err)
		}
		cons = append(cons, c)
	}

	handoffLoop{
		cons: cons,
		queued: func() (int, error) {
			r, err := admin.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				return 0, err
			}
			return int(r.Count), nil
		},
		dump: func(state []atomic.Int32) string { return dumpQueue(admin, key, state) },
	}.run(b, ctx, cancel)
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
