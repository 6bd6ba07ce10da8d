package test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// handoffLoop runs the handoff benchmark over contenders that are already
// created: each campaigns, records the time since the previous holder's
// release, releases and campaigns again. The clock starts when queued
// reports every contender queued and warm untimed handoffs have passed;
// b.N handoffs are timed. It fails the benchmark on two holders at once and
// on a stall (no handoff for stallTimeout), printing dump's description.
// begin and end, when set, run just inside the timed part; queuedHook
// runs once every contender is queued, before the first release (the cost
// measurements: heap and goroutines per idle candidate). count, when
// positive, is the number of timed handoffs instead of b.N (the 1,000
// contender runs time fewer).
//
// yield makes a releaser wait until another contender holds before it
// campaigns again, and hold makes each holder keep the lock that long
// (untimed) before it releases. Locks that keep no queue (Redis) need both:
// without yield the releaser, awake and first to ask, mostly takes its own
// lock back, and without hold the yielder's first try finds the lock free
// again, so the loop would time the harness instead of the lock's own wait.
// holdUntil, when set, makes each holder wait (untimed) until it returns
// before it releases: the contenders that are separate processes
// (etcdctl lock) need it, since a releaser re-queues by starting a new
// process, which takes longer than a handoff. The untimed holds are left
// out of handoffs/s, which is the timed handoffs over the wall time between
// the first timed release and the last acquisition less those holds.
type handoffLoop struct {
	cons       []contender
	warm       int
	count      int
	queued     func() (int, error)
	dump       func(state []atomic.Int32) string
	queuedHook func() []metric
	begin      func(b *testing.B)
	end        func(b *testing.B)
	yield      bool
	hold       time.Duration
	holdUntil  func(ctx context.Context) error
	// trace, when set, is told of every timed handoff: the releasing and
	// the acquiring contender's index, the release and the acquisition
	// times. It runs under the loop's lock and must be quick.
	trace func(from, to int, release, acquired time.Time)
}

func (h handoffLoop) run(b *testing.B, ctx context.Context, cancel context.CancelFunc) {
	n, warm, cons := len(h.cons), h.warm, h.cons
	count := b.N
	if h.count > 0 {
		count = h.count
	}
	st := &handoffState{lats: make([]time.Duration, 0, count), acquired: make(chan struct{})}
	start := make(chan struct{})    // closed when every contender is queued
	warmed := make(chan struct{})   // closed after the warm-up handoffs
	begun := make(chan struct{})    // closed once h.begin has read the counters
	finished := make(chan struct{}) // closed after the last timed handoff
	var finishOnce, warmOnce sync.Once
	finish := func() { finishOnce.Do(func() { close(finished) }) }

	state := make([]atomic.Int32, n) // per contender: campaigning, holding or resigning
	var wg sync.WaitGroup
	for i, c := range cons {
		wg.Go(func() {
			defer finish() // on error too, so the benchmark goroutine never waits forever
			for {
				state[i].Store(stCampaigning)
				if err := c.campaign(ctx); err != nil {
					if ctx.Err() == nil {
						b.Errorf("contender %d: campaign: %v", i, err)
						cancel()
					}
					return
				}
				state[i].Store(stHolding)
				if h := st.holders.Add(1); h != 1 {
					b.Errorf("contender %d elected while %d other(s) hold the key", i, h-1)
				}
				// The first holder keeps the key until every contender has
				// queued behind it; later holders pass straight through.
				select {
				case <-start:
				case <-ctx.Done():
					return
				}
				st.mu.Lock()
				now := time.Now()
				close(st.acquired) // wake the releaser that yielded
				st.acquired = make(chan struct{})
				if st.haveRelease {
					if st.handoffs >= warm {
						st.lats = append(st.lats, now.Sub(st.release))
						st.last = now
						if h.trace != nil {
							h.trace(st.releaser, i, st.release, now)
						}
					}
					st.handoffs++
				}
				if st.handoffs == warm {
					warmOnce.Do(func() { close(warmed) })
					// The first timed release waits until the cost
					// counters are read, so that they cover every timed
					// handoff (untimed: its release time is read after).
					st.mu.Unlock()
					select {
					case <-begun:
					case <-ctx.Done():
						return
					}
					st.mu.Lock()
				}
				if st.handoffs >= warm+count {
					st.mu.Unlock()
					finish() // keep the key: nobody else may win after this
					return
				}
				if h.hold > 0 || h.holdUntil != nil {
					st.mu.Unlock()
					t0 := time.Now()
					time.Sleep(h.hold) // the yielder goes back to waiting
					if h.holdUntil != nil {
						if err := h.holdUntil(ctx); err != nil {
							if ctx.Err() == nil {
								b.Errorf("contender %d: hold: %v", i, err)
								cancel()
							}
							return
						}
					}
					held := time.Since(t0)
					st.mu.Lock()
					if st.handoffs > warm { // inside the timed window
						st.held += held
					}
				}
				st.holders.Add(-1)
				st.release, st.haveRelease, st.releaser = time.Now(), true, i
				if st.handoffs == warm {
					st.first = st.release
				}
				next := st.acquired
				st.mu.Unlock()
				state[i].Store(stResigning)
				if err := c.resign(ctx); err != nil {
					if ctx.Err() == nil {
						b.Errorf("contender %d: resign: %v", i, err)
						cancel()
					}
					return
				}
				if h.yield {
					select {
					case <-next:
					case <-ctx.Done():
						return
					}
				}
			}
		})
	}

	// Start once all n are queued under the key.
	for {
		q, err := h.queued()
		if err == nil && q == n {
			break
		}
		if ctx.Err() != nil {
			cancel()
			wg.Wait()
			b.Fatalf("contenders not all queued: %v (last count %d, err %v)", ctx.Err(), q, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	var costs []metric
	if h.queuedHook != nil {
		costs = h.queuedHook()
	}
	close(start)
	if !awaitFinished(ctx, st, warmed) {
		b.Errorf("warm-up stopped after %d of %d handoffs (stall limit %v, ctx: %v):\n%s", st.count(), warm, stallTimeout, ctx.Err(), h.dump(state))
		cancel()
		wg.Wait()
		return
	}
	if h.begin != nil {
		h.begin(b)
	}
	close(begun)
	b.ResetTimer()
	if !awaitFinished(ctx, st, finished) {
		b.StopTimer()
		b.Errorf("run stopped after %d of %d handoffs (stall limit %v, ctx: %v):\n%s", st.count()-warm, count, stallTimeout, ctx.Err(), h.dump(state))
		cancel()
		wg.Wait()
		return
	}
	b.StopTimer()
	// Per timed handoff, not per b.N: fewer are timed at 1,000
	// contenders, and ZooKeeper's rounds may time more (-zkbench.count).
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(count), "ns/op")
	if h.end != nil {
		h.end(b)
	}
	// Now: ResetTimer drops the metrics reported before it.
	reportMetrics(b, costs)
	cancel() // release the waiters still campaigning
	wg.Wait()
	if b.Failed() {
		return
	}

	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.lats) != count {
		b.Fatalf("recorded %d handoffs, want %d", len(st.lats), count)
	}
	reportLatencies(b, st.lats, st.last.Sub(st.first)-st.held)
}
