package zkelect_test

import (
	"context"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/zkelect"
)

// keyData reads key's node's data.
func keyData(t *testing.T, raw *zk.Conn, key string) string {
	t.Helper()
	d, _, err := raw.Get(key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(d)
}

// recordLine queues n sessions with handover records on every queue, in
// order, under a new key ("a", "b", ...), and has the first lead, proven
// by its Enqueue's read. raw is a plain connection for inspection.
func recordLine(ctx context.Context, t *testing.T, n int) (key string, raw *zk.Conn, ss []*predictSession, tks []election.Ticket) {
	t.Helper()
	key, raw = electiontest.Key(t), rawConn(t, "", "")
	for i := range n {
		s := newPredictSession(t, zkelect.WithHandoverRecords(1))
		ss = append(ss, s)
		tks = append(tks, s.enqueue(t, key, string(rune('a'+i))))
	}
	headWithin(t, ss[0].waitHeadAsync(ctx, tks[0]), "a queued first")
	return key, raw, ss, tks
}

// TestHandover_SuccessorReadsNoQueue: with records on every queue, a head
// proven by a wake-up records its release in the key node's data, in the
// multi that deletes its node, and its successor, woken by that delete,
// leads without reading the queue; so does the next one. A head that
// proved itself by its first read (A) records nothing: its successor (B)
// finds no record and reads the queue. A session proven first by a record
// (C) knows its next predecessor without a read too: the node its own
// predecessor's session (B) queued again under its next guid.
func TestHandover_SuccessorReadsNoQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, raw, ss, tks := recordLine(ctx, t, 4)
	a, b, c, d := ss[0], ss[1], ss[2], ss[3]
	ta, tb, tc, td := tks[0], tks[1], tks[2], tks[3]
	bDone, cDone, dDone := b.waitHeadAsync(ctx, tb), c.waitHeadAsync(ctx, tc), d.waitHeadAsync(ctx, td)
	notYet(t, bDone, 200*time.Millisecond, "a is ahead")
	bReads, cReads, dReads := b.reads.Load(), c.reads.Load(), d.reads.Load()

	a.dequeue(t, ta)
	if n := a.multi.Load(); n != 0 {
		t.Fatalf("a, first by its Enqueue's read, sent %d multis, want 0 (no record)", n)
	}
	if got := keyData(t, raw, key); got != "" {
		t.Fatalf("key data after a's release = %q, want none", got)
	}
	headWithin(t, bDone, "a left")
	b.wantReads(t, bReads, 1, "b, woken by a's delete, which recorded nothing")

	b.dequeue(t, tb)
	if n := b.multi.Load(); n != 1 {
		t.Fatalf("b sent %d multis, want 1 (its delete and the record)", n)
	}
	if got, want := keyData(t, raw, key), "tenure-released "+path.Base(tb.Name); got != want {
		t.Fatalf("key data after b's release = %q, want %q", got, want)
	}
	headWithin(t, cDone, "b left")
	c.wantReads(t, cReads, 0, "c, proven first by b's record")
	notYet(t, dDone, 100*time.Millisecond, "c leads")

	// B queues again (B2, predicted from its read), then C leaves and
	// queues again: C2's predecessor is B2, known from B's name.
	bReads = b.reads.Load()
	tb2 := b.enqueue(t, key, "b")
	b2Done := b.waitHeadAsync(ctx, tb2)
	c.dequeue(t, tc)
	headWithin(t, dDone, "c left")
	d.wantReads(t, dReads, 0, "d, proven first by c's record")
	tc2 := c.enqueue(t, key, "c")
	c2Done := c.waitHeadAsync(ctx, tc2)
	notYet(t, c2Done, 200*time.Millisecond, "d and b2 are ahead")
	d.dequeue(t, td)
	headWithin(t, b2Done, "d left")
	b.wantReads(t, bReads, 0, "b's second campaign, proven first by d's record")
	notYet(t, c2Done, 100*time.Millisecond, "b2 leads")
	b.dequeue(t, tb2)
	headWithin(t, c2Done, "b2 left")
	c.wantReads(t, cReads, 0, "c's two campaigns (the second's predecessor predicted from b's guid)")
	c.dequeue(t, tc2)
	if got, want := keyData(t, raw, key), "tenure-released "+path.Base(tc2.Name); got != want {
		t.Fatalf("key data after c2's release = %q, want %q", got, want)
	}
}

// TestHandover_CloseRecordsTheHandoverInOneRequest: a head whose session
// closes (a leader past its lease deadline closes its session rather than
// resign) releases its node with the record, in one multi and nothing
// else; its successor leads without reading the queue. (Close's tickets
// carry no key: a multi built from it failed, and the delete that
// followed crossed the link a second time; the chaos suite's slow
// scenario, whose leaders close across a link of 0.3–0.8 TTL each way,
// saw that as failovers 0.4–0.5 s over their bound.)
func TestHandover_CloseRecordsTheHandoverInOneRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, raw, ss, tks := recordLine(ctx, t, 3)
	a, b, c := ss[0], ss[1], ss[2]
	ta, tb, tc := tks[0], tks[1], tks[2]
	bDone, cDone := b.waitHeadAsync(ctx, tb), c.waitHeadAsync(ctx, tc)
	notYet(t, bDone, 200*time.Millisecond, "a is ahead")
	a.dequeue(t, ta)
	headWithin(t, bDone, "a left")
	cReads := c.reads.Load()
	multis, deletes := b.multi.Load(), b.deletes.Load()
	if err := b.Close(ctx); err != nil {
		t.Fatalf("b's Close: %v", err)
	}
	if m, d := b.multi.Load()-multis, b.deletes.Load()-deletes; m != 1 || d != 0 {
		t.Fatalf("b's Close sent %d multis and %d deletes, want 1 and 0", m, d)
	}
	if got, want := keyData(t, raw, key), "tenure-released "+path.Base(tb.Name); got != want {
		t.Fatalf("key data after b's Close = %q, want %q", got, want)
	}
	headWithin(t, cDone, "b closed")
	c.wantReads(t, cReads, 0, "c, proven first by b's record")
}

// TestHandover_OwnNodeDeletedWithTheRecordIsNotElected: a multi that
// deletes the waiter's predecessor, writes a record naming it, and deletes
// the waiter's own node, wakes the waiter with a record that names its
// predecessor: its own node's absence must keep it from leading. This is
// the case that made an earlier skip of the wake-up read unsafe
// (TestWake_OwnNodeDeletedWithPredecessorIsNotElected). Odd rounds: the
// waiter's session had seen the queue before it queued, so it watches its
// own node from its create, and learns of the delete from that watch's
// event, which arrives before the record's read is answered (no exists
// sent); even rounds: it had not, and sends an exists with the read.
func TestHandover_OwnNodeDeletedWithTheRecordIsNotElected(t *testing.T) {
	raw := rawConn(t, "", "")
	rec := zkelect.WithHandoverRecords(1)
	for round := range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		key := electiontest.Key(t) + "-" + string(rune('a'+round))
		p, w := newPredictSession(t, rec), newPredictSession(t, rec)
		tp := p.enqueue(t, key, "p")
		watched := round%2 == 1
		if watched {
			// w looks at the queue once (p and a node of its own), then
			// queues for real.
			w0 := w.enqueue(t, key, "w")
			if n, err := w.Ahead(ctx, w0); err != nil || n != 1 {
				t.Fatalf("round %d: Ahead = %d, %v; want 1", round, n, err)
			}
			w.dequeue(t, w0)
		}
		tw := w.enqueue(t, key, "w")
		headWithin(t, p.waitHeadAsync(ctx, tp), "p queued first")
		done := w.waitHeadAsync(ctx, tw)
		notYet(t, done, 200*time.Millisecond, "p is ahead")
		exists := w.exists.Load()
		if _, err := raw.Multi(
			&zk.DeleteRequest{Path: tp.Name, Version: -1},
			&zk.SetDataRequest{Path: key, Data: []byte("tenure-released " + path.Base(tp.Name)), Version: -1},
			&zk.DeleteRequest{Path: tw.Name, Version: -1},
		); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, tenure.ErrOwnershipLost) {
				t.Fatalf("round %d (own watch %v): w's WaitHead = %v, want ErrOwnershipLost (its node is gone)", round, watched, err)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: w's WaitHead did not end", round)
		}
		switch sent := w.exists.Load() - exists; {
		case watched && sent != 0:
			t.Fatalf("round %d: w sent %d exists, want none (its own node's watch answers)", round, sent)
		case !watched && sent != 1:
			t.Fatalf("round %d: w sent %d exists, want 1 (with the record's read)", round, sent)
		}
		cancel()
	}
}

// TestHandover_ARecordOfAnotherNodeDoesNotElect: the waiter's predecessor
// goes while the record names another node, and a raw client's node is
// still ahead of it: the waiter reads the queue, sees that node, and waits
// on it; it leads once that node goes.
func TestHandover_ARecordOfAnotherNodeDoesNotElect(t *testing.T) {
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := rawConn(t, "", "")
	rec := zkelect.WithHandoverRecords(1)
	if _, err := raw.Create(key, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	first, err := raw.Create(key+"/raw-lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	p, w := newPredictSession(t, rec), newPredictSession(t, rec)
	tp, tw := p.enqueue(t, key, "p"), w.enqueue(t, key, "w")
	done := w.waitHeadAsync(ctx, tw)
	notYet(t, done, 200*time.Millisecond, "the raw node and p are ahead")
	// p leaves without leading; the record names the raw node, as if it
	// had been released as a head.
	if _, err := raw.Set(key, []byte("tenure-released "+path.Base(first)), -1); err != nil {
		t.Fatal(err)
	}
	reads := w.reads.Load()
	p.dequeue(t, tp)
	notYet(t, done, 300*time.Millisecond, "the raw node is still ahead")
	w.wantReads(t, reads, 1, "w, woken by p's delete with no record of it")
	if err := raw.Delete(first, -1); err != nil {
		t.Fatal(err)
	}
	headWithin(t, done, "the raw node left")
}

// TestHandover_RecordRefusedByTheACLStillReleases: a key node whose ACL
// lets tenure read it and add and remove children but not write its data
// refuses the record: the release still deletes the node (the multi fails,
// the delete alone follows), the successor leads, and the session tries no
// record on that key again.
func TestHandover_RecordRefusedByTheACLStillReleases(t *testing.T) {
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := rawConn(t, "", "")
	acl := zk.WorldACL(zk.PermRead | zk.PermCreate | zk.PermDelete)
	if _, err := raw.Create(key, nil, 0, acl); err != nil {
		t.Fatal(err)
	}
	first, err := raw.Create(key+"/raw-lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	rec := zkelect.WithHandoverRecords(1)
	b, w := newPredictSession(t, rec), newPredictSession(t, rec)
	tb, tw := b.enqueue(t, key, "b"), w.enqueue(t, key, "w")
	bDone, wDone := b.waitHeadAsync(ctx, tb), w.waitHeadAsync(ctx, tw)
	notYet(t, bDone, 200*time.Millisecond, "the raw node is ahead")
	if err := raw.Delete(first, -1); err != nil {
		t.Fatal(err)
	}
	headWithin(t, bDone, "the raw node left")
	b.dequeue(t, tb)
	if n := b.multi.Load(); n != 1 {
		t.Fatalf("b sent %d multis, want 1 (refused)", n)
	}
	if ok, _, err := raw.Exists(tb.Name); err != nil || ok {
		t.Fatalf("b's node after its release: exists %v, %v; want gone", ok, err)
	}
	headWithin(t, wDone, "b left")
	if got := keyData(t, raw, key); got != "" {
		t.Fatalf("key data = %q, want none (the ACL refuses writes)", got)
	}
	tb2 := b.enqueue(t, key, "b")
	b2Done := b.waitHeadAsync(ctx, tb2)
	w.dequeue(t, tw)
	headWithin(t, b2Done, "w left")
	b.dequeue(t, tb2)
	if n := b.multi.Load(); n != 1 {
		t.Fatalf("b sent %d multis in all, want 1: a refused record is not tried again", n)
	}
}

// TestHandover_DataNotARecordIsLeftAlone: a key node that carries data of
// its own (not a record) is never written: heads release with a plain
// delete, and the data stays.
func TestHandover_DataNotARecordIsLeftAlone(t *testing.T) {
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw := rawConn(t, "", "")
	if _, err := raw.Create(key, []byte("owner=billing"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	rec := zkelect.WithHandoverRecords(1)
	ss := []*predictSession{newPredictSession(t, rec), newPredictSession(t, rec), newPredictSession(t, rec)}
	tks := []election.Ticket{}
	for i, s := range ss {
		tks = append(tks, s.enqueue(t, key, string(rune('a'+i))))
	}
	var dones []<-chan error
	for i, s := range ss {
		dones = append(dones, s.waitHeadAsync(ctx, tks[i]))
	}
	notYet(t, dones[1], 200*time.Millisecond, "a is ahead")
	for i, s := range ss {
		headWithin(t, dones[i], "the ones ahead left")
		s.dequeue(t, tks[i])
		if n := s.multi.Load(); n != 0 {
			t.Fatalf("%c sent %d multis, want 0", 'a'+i, n)
		}
		if i > 0 && s.exists.Load() == 0 {
			t.Fatalf("%c, woken by a delete, read no record: the test shows nothing", 'a'+i)
		}
	}
	if got := keyData(t, raw, key); got != "owner=billing" {
		t.Fatalf("key data = %q, want the owner's", got)
	}
}

// TestConformance_ZooKeeperHandoverOnEveryRelease runs the conformance
// suite with handover records on every queue, not only on queues of 32
// nodes or more, which the suite's queues seldom reach.
func TestConformance_ZooKeeperHandoverOnEveryRelease(t *testing.T) {
	electiontest.Run(t, newHarness(t, server.Endpoints(), zkelect.WithHandoverRecords(1)))
}
