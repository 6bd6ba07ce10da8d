package zkelect

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// bareBackend is a Backend without a connection: enough for call and
// Close.
func bareBackend() *Backend {
	return &Backend{sessions: map[*session]struct{}{}, changed: make(chan struct{}),
		tasks: make(chan func()), quit: make(chan struct{})}
}

// workers counts the goroutines running a call worker.
func workers() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "zkelect.(*Backend).worker(")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCall_WorkersAreReusedBoundedAndStoppedByClose: calls run on
// goroutines that wait for the next call (a new goroutine per call grows
// its stack through go-zookeeper's request path every time); at most
// maxIdleWorkers wait; Close stops them; a call abandoned by its ctx still
// runs undo with its result.
func TestCall_WorkersAreReusedBoundedAndStoppedByClose(t *testing.T) {
	before := workers()
	b := bareBackend()
	ctx := context.Background()

	const n = 3 * maxIdleWorkers
	release := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		go func() {
			v, err := call(ctx, b, func() (int, error) { <-release; return 7, nil }, nil)
			if err == nil && v != 7 {
				err = errors.New("wrong value")
			}
			errs <- err
		}()
	}
	waitFor(t, "every call on its own worker", func() bool { return workers() == before+n })
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the workers beyond maxIdleWorkers gone", func() bool { return workers() == before+maxIdleWorkers })
	if got := b.idle.Load(); got != maxIdleWorkers {
		t.Fatalf("idle = %d, want %d", got, maxIdleWorkers)
	}

	// The next calls reuse the idle workers: none is started.
	for i := range 100 {
		if v, err := call(ctx, b, func() (int, error) { return i, nil }, nil); err != nil || v != i {
			t.Fatalf("call %d = %d, %v", i, v, err)
		}
	}
	// (One more may start when a call comes before the worker that ran
	// the last one waits again; it exits once it finds four waiting.)
	waitFor(t, "the idle workers only, after 100 sequential calls", func() bool { return workers() == before+maxIdleWorkers })

	// Abandoned: the caller returns at its ctx's end; undo gets the result.
	cctx, cancel := context.WithCancel(ctx)
	hold := make(chan struct{})
	undone := make(chan int, 1)
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	_, err := call(cctx, b, func() (int, error) { <-hold; return 42, nil }, func(v int, err error) { undone <- v })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call returned %v, want context.Canceled", err)
	}
	close(hold)
	select {
	case v := <-undone:
		if v != 42 {
			t.Fatalf("undo got %d, want 42", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("undo did not run")
	}

	b.Close()
	waitFor(t, "no worker left after Close", func() bool { return workers() == before })
	if _, err := call(ctx, b, func() (int, error) { return 1, nil }, nil); err == nil {
		t.Fatal("a call after Close ran")
	}
}

// TestCall_AResultIsReturnedOrUndoneNeverBoth: a call whose ctx ends as
// its result comes either returns the result or undoes it (deleting what
// a create made), never both: a campaign handed a node its own undo is
// deleting would lead on a node about to go. Many calls, each cancelled
// at about the moment its result comes; after Close, the undone results
// must be exactly the calls that returned ctx's error.
func TestCall_AResultIsReturnedOrUndoneNeverBoth(t *testing.T) {
	b := bareBackend()
	var undone atomic.Int64
	var returned, cancelled int64
	const n = 100000
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		// The result comes as ctx ends: both wait for the cancel.
		_, err := call(ctx, b, func() (int, error) { <-ctx.Done(); return i, nil }, func(int, error) { undone.Add(1) })
		switch {
		case err == nil:
			returned++
		case errors.Is(err, context.Canceled):
			cancelled++
		default:
			t.Fatalf("call %d: %v", i, err)
		}
		cancel()
	}
	b.Close() // waits for every call's worker, undo included
	t.Logf("%d calls: %d returned, %d gave up, %d undone", n, returned, cancelled, undone.Load())
	if undone.Load() != cancelled {
		t.Fatalf("%d results undone for %d calls given up: %d were both returned and undone", undone.Load(), cancelled, undone.Load()-cancelled)
	}
}
