package zkelect_test

import (
	"context"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/zkelect"
)

// predictSession is one contender of the prediction tests: a session on
// its own backend whose children reads (getChildren, getChildren2) are
// counted.
type predictSession struct {
	election.Session
	reads atomic.Int64
}

func newPredictSession(t *testing.T) *predictSession {
	t.Helper()
	p := &predictSession{}
	b := dialWith(t, zkelect.WithDialer(opDialer(func(op int32) {
		if op == 8 || op == 12 { // getChildren, getChildren2
			p.reads.Add(1)
		}
	})))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	p.Session = s
	return p
}

func (p *predictSession) enqueue(t *testing.T, key, id string) election.Ticket {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tk, err := p.Enqueue(ctx, key, id)
	if err != nil {
		t.Fatalf("%s: Enqueue: %v", id, err)
	}
	return tk
}

func (p *predictSession) dequeue(t *testing.T, tk election.Ticket) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Dequeue(ctx, tk); err != nil {
		t.Fatalf("Dequeue %s: %v", tk.Name, err)
	}
}

// waitHeadAsync starts WaitHead on tk and returns where its outcome arrives.
func (p *predictSession) waitHeadAsync(ctx context.Context, tk election.Ticket) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := p.WaitHead(ctx, tk)
		done <- err
	}()
	return done
}

// notYet fails the test if done delivers within d.
func notYet(t *testing.T, done <-chan error, d time.Duration, why string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("WaitHead returned (%v) while %s", err, why)
	case <-time.After(d):
	}
}

func headWithin(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitHead: %v (%s)", err, why)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("WaitHead did not return: %s", why)
	}
}

// TestPredict_RequeueAfterReadSkipsTheRead: a contender that read the
// queue (A, B, C, D) and leaves it, then queues again with no other create
// in between, knows its predecessor without reading the queue: D, the last
// of that read. It waits on D alone: B and C leaving do not make it first,
// D leaving does (after one read, which shows it first).
func TestPredict_RequeueAfterReadSkipsTheRead(t *testing.T) {
	key := electiontest.Key(t)
	ss := map[string]*predictSession{}
	tks := map[string]election.Ticket{}
	for _, id := range []string{"a", "b", "c", "d"} {
		ss[id] = newPredictSession(t)
		tks[id] = ss[id].enqueue(t, key, id)
	}
	a := ss["a"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	headWithin(t, a.waitHeadAsync(ctx, tks["a"]), "a queued first")
	// A read of the queue with all four in it (WaitHead's was made before
	// the others queued).
	if n, err := a.Ahead(ctx, tks["a"]); err != nil || n != 0 {
		t.Fatalf("Ahead(a) = %d, %v; want 0 (a queued first)", n, err)
	}
	a.dequeue(t, tks["a"])
	before := a.reads.Load()
	a2 := a.enqueue(t, key, "a")
	if got := a.reads.Load() - before; got != 0 {
		t.Fatalf("a's second Enqueue read the queue %d times; want none (its last read shows the queue ahead of it)", got)
	}
	done := a.waitHeadAsync(ctx, a2)
	notYet(t, done, 200*time.Millisecond, "b, c and d are ahead")
	if got := a.reads.Load() - before; got != 0 {
		t.Fatalf("a's WaitHead read the queue %d times before any wake-up; want none", got)
	}
	ss["b"].dequeue(t, tks["b"])
	ss["c"].dequeue(t, tks["c"])
	notYet(t, done, 300*time.Millisecond, "d is ahead")
	if got := a.reads.Load() - before; got != 0 {
		t.Fatalf("b and c leaving made a read the queue %d times; a watches d alone, want none", got)
	}
	ss["d"].dequeue(t, tks["d"])
	headWithin(t, done, "d, a's predecessor, left")
	if got := a.reads.Load() - before; got != 1 {
		t.Fatalf("a read the queue %d times from its second Enqueue to its lead; want 1 (after d's delete)", got)
	}
}

// TestPredict_RequeuedPredecessorByItsGUID: the leader H, woken by P's
// delete, read a queue (H, W) without P's requeued node P2, which P made
// right after. H then leaves and queues again: one child (P2) was created
// between H's read and H's new node. P2's name follows from P's (a
// session's guids on a key are a chain), so H waits on P2 without a read.
// A node of the same place that is not the chain's next (a raw client's) is
// found by a read instead, and waited on.
func TestPredict_RequeuedPredecessorByItsGUID(t *testing.T) {
	for _, foreign := range []bool{false, true} {
		name := "tenure"
		if foreign {
			name = "foreign"
		}
		t.Run(name, func(t *testing.T) {
			key := electiontest.Key(t)
			p, h, w := newPredictSession(t), newPredictSession(t), newPredictSession(t)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			tp := p.enqueue(t, key, "p")
			th := h.enqueue(t, key, "h")
			tw := w.enqueue(t, key, "w")
			hDone := h.waitHeadAsync(ctx, th)
			notYet(t, hDone, 200*time.Millisecond, "p is ahead")
			p.dequeue(t, tp)
			headWithin(t, hDone, "p left")
			// P's requeue, after H's read.
			var p2 string
			if foreign {
				raw := rawConn(t, "", "")
				made, err := raw.Create(key+"/_c_00000000-0000-4000-8000-000000000000-lock-", []byte("x"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
				if err != nil {
					t.Fatal(err)
				}
				p2 = made
			} else {
				p2 = p.enqueue(t, key, "p").Name
			}
			h.dequeue(t, th)
			before := h.reads.Load()
			th2 := h.enqueue(t, key, "h")
			if got := h.reads.Load() - before; got != 0 {
				t.Fatalf("h's second Enqueue read the queue %d times; want none", got)
			}
			done := h.waitHeadAsync(ctx, th2)
			notYet(t, done, 200*time.Millisecond, "w and "+path.Base(p2)+" are ahead")
			wantReads := int64(0)
			if foreign {
				wantReads = 1 // the predicted node does not exist: read, then wait on p2
			}
			if got := h.reads.Load() - before; got != wantReads {
				t.Fatalf("h read the queue %d times before any wake-up; want %d", got, wantReads)
			}
			w.dequeue(t, tw)
			notYet(t, done, 300*time.Millisecond, path.Base(p2)+" is ahead")
			if got := h.reads.Load() - before; got != wantReads {
				t.Fatalf("w leaving made h read the queue (%d reads); h waits on %s alone", got-wantReads, path.Base(p2))
			}
			if foreign {
				raw := rawConn(t, "", "")
				if err := raw.Delete(p2, -1); err != nil {
					t.Fatal(err)
				}
			} else {
				p.dequeue(t, election.Ticket{Key: key, Name: p2})
			}
			headWithin(t, done, path.Base(p2)+" left")
			if !strings.HasPrefix(path.Base(th2.Name), "_c_") {
				t.Fatalf("h's node %s is not protected", th2.Name)
			}
		})
	}
}

// TestPredict_PredecessorGoneBeforeTheWatch: the predicted predecessor (D,
// the last of the read) left before the requeued node's watch reached it:
// the waiter finds it gone, reads the queue once, and waits on C, the
// predecessor that read shows.
func TestPredict_PredecessorGoneBeforeTheWatch(t *testing.T) {
	key := electiontest.Key(t)
	ss := map[string]*predictSession{}
	tks := map[string]election.Ticket{}
	for _, id := range []string{"a", "b", "c", "d"} {
		ss[id] = newPredictSession(t)
		tks[id] = ss[id].enqueue(t, key, id)
	}
	a := ss["a"]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	headWithin(t, a.waitHeadAsync(ctx, tks["a"]), "a queued first")
	if n, err := a.Ahead(ctx, tks["a"]); err != nil || n != 0 {
		t.Fatalf("Ahead(a) = %d, %v; want 0", n, err)
	}
	a.dequeue(t, tks["a"])
	ss["d"].dequeue(t, tks["d"])
	before := a.reads.Load()
	a2 := a.enqueue(t, key, "a")
	if got := a.reads.Load() - before; got != 0 {
		t.Fatalf("a's second Enqueue read the queue %d times; want none", got)
	}
	done := a.waitHeadAsync(ctx, a2)
	notYet(t, done, 300*time.Millisecond, "b and c are ahead")
	if got := a.reads.Load() - before; got != 1 {
		t.Fatalf("a read the queue %d times after finding d gone; want 1", got)
	}
	ss["b"].dequeue(t, tks["b"])
	notYet(t, done, 300*time.Millisecond, "c is ahead")
	if got := a.reads.Load() - before; got != 1 {
		t.Fatalf("b leaving made a read the queue; a waits on c alone (%d reads)", got)
	}
	ss["c"].dequeue(t, tks["c"])
	headWithin(t, done, "c left")
}
