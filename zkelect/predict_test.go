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
	reads   atomic.Int64 // getChildren, getChildren2
	exists  atomic.Int64 // exists: a wake-up's handover record read sends one, with a getData
	multi   atomic.Int64
	deletes atomic.Int64
}

func newPredictSession(t *testing.T, opts ...zkelect.Option) *predictSession {
	t.Helper()
	p := &predictSession{}
	b := dialWith(t, append([]zkelect.Option{zkelect.WithDialer(opDialer(func(op int32) {
		switch op {
		case 8, 12: // getChildren, getChildren2
			p.reads.Add(1)
		case 2:
			p.deletes.Add(1)
		case 3:
			p.exists.Add(1)
		case 14:
			p.multi.Add(1)
		}
	}))}, opts...)...)
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

// wantReads fails the test unless p has read the queue want times since
// the count was before.
func (p *predictSession) wantReads(t *testing.T, before, want int64, what string) {
	t.Helper()
	if got := p.reads.Load() - before; got != want {
		t.Fatalf("%s: %d reads of the queue, want %d", what, got, want)
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

// queueFour queues a, b, c and d, in that order, each on its own session,
// and has a (the head) read the queue with all four in it.
func queueFour(ctx context.Context, t *testing.T, key string) (map[string]*predictSession, map[string]election.Ticket) {
	t.Helper()
	ss := map[string]*predictSession{}
	tks := map[string]election.Ticket{}
	for _, id := range []string{"a", "b", "c", "d"} {
		ss[id] = newPredictSession(t)
		tks[id] = ss[id].enqueue(t, key, id)
	}
	a := ss["a"]
	headWithin(t, a.waitHeadAsync(ctx, tks["a"]), "a queued first")
	// WaitHead's read was made before the others queued: read again.
	if n, err := a.Ahead(ctx, tks["a"]); err != nil || n != 0 {
		t.Fatalf("Ahead(a) = %d, %v; want 0 (a queued first)", n, err)
	}
	return ss, tks
}

// TestPredict_RequeueAfterReadSkipsTheRead: a contender that read the
// queue (A, B, C, D) and leaves it, then queues again with no other create
// in between, knows its predecessor without reading the queue: D, the last
// of that read. It waits on D alone: B and C leaving do not make it first,
// D leaving does (after one read, which shows it first).
func TestPredict_RequeueAfterReadSkipsTheRead(t *testing.T) {
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, tks := queueFour(ctx, t, key)
	a := ss["a"]
	a.dequeue(t, tks["a"])
	before := a.reads.Load()
	a2 := a.enqueue(t, key, "a")
	a.wantReads(t, before, 0, "a's second Enqueue (its last read shows the queue ahead of it)")
	done := a.waitHeadAsync(ctx, a2)
	notYet(t, done, 200*time.Millisecond, "b, c and d are ahead")
	a.wantReads(t, before, 0, "a's WaitHead, before any wake-up")
	ss["b"].dequeue(t, tks["b"])
	ss["c"].dequeue(t, tks["c"])
	notYet(t, done, 300*time.Millisecond, "d is ahead")
	a.wantReads(t, before, 0, "b and c leaving (a watches d alone)")
	ss["d"].dequeue(t, tks["d"])
	headWithin(t, done, "d, a's predecessor, left")
	a.wantReads(t, before, 1, "from a's second Enqueue to its lead (one, after d's delete)")
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
			h.wantReads(t, before, 0, "h's second Enqueue")
			done := h.waitHeadAsync(ctx, th2)
			notYet(t, done, 200*time.Millisecond, "w and "+path.Base(p2)+" are ahead")
			wantReads := int64(0)
			if foreign {
				wantReads = 1 // the predicted node does not exist: read, then wait on p2
			}
			h.wantReads(t, before, wantReads, "h's WaitHead, before any wake-up")
			w.dequeue(t, tw)
			notYet(t, done, 300*time.Millisecond, path.Base(p2)+" is ahead")
			h.wantReads(t, before, wantReads, "w leaving (h waits on "+path.Base(p2)+" alone)")
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ss, tks := queueFour(ctx, t, key)
	a := ss["a"]
	a.dequeue(t, tks["a"])
	ss["d"].dequeue(t, tks["d"])
	before := a.reads.Load()
	a2 := a.enqueue(t, key, "a")
	a.wantReads(t, before, 0, "a's second Enqueue")
	done := a.waitHeadAsync(ctx, a2)
	notYet(t, done, 300*time.Millisecond, "b and c are ahead")
	a.wantReads(t, before, 1, "a finding d gone")
	ss["b"].dequeue(t, tks["b"])
	notYet(t, done, 300*time.Millisecond, "c is ahead")
	a.wantReads(t, before, 1, "b leaving (a waits on c alone)")
	ss["c"].dequeue(t, tks["c"])
	headWithin(t, done, "c left")
}
