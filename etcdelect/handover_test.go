package etcdelect_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

// rangeLog records the ranges a client sends, in Range and in Txn requests,
// and counts the watches the server confirmed created on its streams.
type rangeLog struct {
	mu      sync.Mutex
	ranges  []*pb.RangeRequest
	created int
}

func (l *rangeLog) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &loggedStream{ClientStream: cs, l: l}, nil
}

type loggedStream struct {
	grpc.ClientStream
	l *rangeLog
}

func (s *loggedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if wr, ok := m.(*pb.WatchResponse); ok && err == nil && wr.Created {
		s.l.mu.Lock()
		s.l.created++
		s.l.mu.Unlock()
	}
	return err
}

// watches returns how many watches the server confirmed created so far.
func (l *rangeLog) watches() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.created
}

func (l *rangeLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	l.mu.Lock()
	switch r := req.(type) {
	case *pb.RangeRequest:
		l.ranges = append(l.ranges, r)
	case *pb.TxnRequest:
		for _, op := range append(append([]*pb.RequestOp(nil), r.Success...), r.Failure...) {
			if rr := op.GetRequestRange(); rr != nil {
				l.ranges = append(l.ranges, rr)
			}
		}
	}
	l.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// since returns how many of the ranges recorded from index from on cover
// more than one key under prefix, and how many read the key name.
func (l *rangeLog) since(from int, prefix, name string) (queueReads, nameReads int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.ranges[from:] {
		switch {
		case len(r.RangeEnd) > 0 && strings.HasPrefix(string(r.Key), prefix):
			queueReads++
		case len(r.RangeEnd) == 0 && string(r.Key) == name:
			nameReads++
		}
	}
	return queueReads, nameReads
}

func (l *rangeLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ranges)
}

func loggedElector(t *testing.T, key, id string, opts ...etcdelect.Option) (*election.Elector, *rangeLog) {
	t.Helper()
	l := &rangeLog{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(l.intercept), grpc.WithChainStreamInterceptor(l.interceptStream)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	e, err := election.New(etcdelect.New(cli, opts...), election.Config{Key: key, Identity: id, TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e, l
}

// fillQueue puts n keys under key's prefix that are not entries (their
// names are not leases), as another program's data would be: they count
// toward the queue's length, not as contenders.
func fillQueue(t *testing.T, admin *clientv3.Client, key string, n int) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	for i := range n {
		if _, err := admin.Put(ctx, fmt.Sprintf("%s/filler-%02d", key, i), "x"); err != nil {
			t.Fatal(err)
		}
	}
}

// campaignAsync campaigns e in a goroutine and delivers the term.
func campaignAsync(ctx context.Context, t *testing.T, e *election.Elector) <-chan tenure.Term {
	ch := make(chan tenure.Term, 1)
	go func() {
		term, err := e.Campaign(ctx)
		if err != nil {
			t.Errorf("Campaign: %v", err)
			return
		}
		ch <- term
	}()
	return ch
}

// TestHandover_LongQueueSuccessorReadsNoQueue: in a queue of 32 keys or
// more, a holder that resigns records the handover in its delete's
// transaction, and the next waiter, woken by that delete, leads after one
// read of its entry and that record, without a range over the queue. On a
// short queue, and with records off (WithHandoverRecords(0)), the same
// successor ranges over the queue and no record is written.
func TestHandover_LongQueueSuccessorReadsNoQueue(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	for _, c := range []struct {
		name string
		long bool
		opts []etcdelect.Option
	}{
		{"long", true, nil},
		{"short", false, nil},
		{"long-records-off", false, []etcdelect.Option{etcdelect.WithHandoverRecords(0)}},
	} {
		long := c.long
		t.Run(c.name, func(t *testing.T) {
			key := electiontest.Key(t)
			if long || c.opts != nil {
				fillQueue(t, admin, key, 33)
			}
			ctx := ctxT(t, 30*time.Second)
			a, _ := loggedElector(t, key, "a", c.opts...)
			b, bl := loggedElector(t, key, "b", c.opts...)
			ta, err := a.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := campaignAsync(ctx, t, b)
			// b waits on its own entry's watch and then on a's.
			waitFor(t, "b's two watches", func() bool { return bl.watches() >= 2 })
			from := bl.len()
			if err := a.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			var tb tenure.Term
			select {
			case tb = <-got:
			case <-ctx.Done():
				t.Fatal("b not elected after a resigned")
			}
			if tb.Token <= ta.Token {
				t.Fatalf("b's token %d not above a's %d", tb.Token, ta.Token)
			}
			queueReads, recordReads := bl.since(from, key+"/", key+".tenure-released")
			rec, err := admin.Get(ctx, key+".tenure-released")
			if err != nil {
				t.Fatal(err)
			}
			if !long {
				if queueReads == 0 || recordReads != 0 || len(rec.Kvs) != 0 {
					t.Fatalf("b made %d queue reads and %d record reads, %d records; want >0, 0, 0", queueReads, recordReads, len(rec.Kvs))
				}
				return
			}
			if queueReads != 0 || recordReads != 1 {
				t.Fatalf("b made %d queue reads and %d record reads from a's resign to its term; want 0 and 1", queueReads, recordReads)
			}
			if want := fmt.Sprintf("%d %s", ta.Token, ta.Entry); len(rec.Kvs) != 1 || string(rec.Kvs[0].Value) != want {
				t.Fatalf("handover record = %v, want %q", rec.Kvs, want)
			}
			// The record lives on the releaser's lease: gone when a's
			// session ends.
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if rec, err := admin.Get(ctx, key+".tenure-released"); err != nil || len(rec.Kvs) != 0 {
				t.Fatalf("handover record after the releaser closed: %v, %v", rec.Kvs, err)
			}
		})
	}
}

// entryOf returns the entry of identity under key, read by admin.
func entryOf(t *testing.T, admin *clientv3.Client, key, identity string) (name string, token int64) {
	t.Helper()
	resp, err := admin.Get(ctxT(t, 5*time.Second), key+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == identity && kv.Lease != 0 {
			return string(kv.Key), kv.CreateRevision
		}
	}
	t.Fatalf("no entry of %s under %s", identity, key)
	return "", 0
}

// TestHandover_OnlyARecordOfTheDeleteItselfElects: in a long queue where a
// leads and p and then w wait, p gives up its wait. p was never first, so
// its delete records no handover; a record naming p that another client
// wrote before that delete (at another revision) proves nothing either. w,
// woken by p's delete, must read the queue, find a, and wait for it.
func TestHandover_OnlyARecordOfTheDeleteItselfElects(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	key := electiontest.Key(t)
	fillQueue(t, admin, key, 33)
	ctx := ctxT(t, 30*time.Second)
	a, _ := loggedElector(t, key, "a")
	p, _ := loggedElector(t, key, "p")
	w, wl := loggedElector(t, key, "w")
	if _, err := a.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	pdone := make(chan error, 1)
	go func() {
		_, err := p.Campaign(pctx)
		pdone <- err
	}()
	waitPos(t, p, 1)
	got := campaignAsync(ctx, t, w)
	waitFor(t, "w's two watches", func() bool { return wl.watches() >= 2 })
	pName, pToken := entryOf(t, admin, key, "p")
	if _, err := admin.Put(ctx, key+".tenure-released", fmt.Sprintf("%d %s", pToken, pName)); err != nil {
		t.Fatal(err)
	}
	from := wl.len()
	pcancel()
	if err := <-pdone; err == nil {
		t.Fatal("p's campaign returned nil after its ctx ended")
	}
	waitFor(t, "p's entry gone", func() bool {
		r, err := admin.Get(ctx, pName)
		return err == nil && len(r.Kvs) == 0
	})
	select {
	case term := <-got:
		t.Fatalf("w elected (term %d) while a leads", term.Token)
	case <-time.After(500 * time.Millisecond):
	}
	if queueReads, recordReads := wl.since(from, key+"/", key+".tenure-released"); queueReads == 0 || recordReads != 1 {
		t.Fatalf("w made %d queue reads and %d record reads after p's delete; want some and 1", queueReads, recordReads)
	}
	if n, err := w.Position(ctx); err != nil || n != 1 {
		t.Fatalf("w's position = %d, %v; want 1 (behind a)", n, err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("w not elected after a resigned")
	}
}

// TestHandover_RecordRefusedByTheRoleStillReleases: a role that covers
// "<key>/" but not "<key>.tenure-released" (key "billing" with the role on
// "billing/", docs/security.md) refuses the handover record. The release
// deletes the entry alone and the next waiter leads after reading the
// queue; no record is written.
func TestHandover_RecordRefusedByTheRoleStillReleases(t *testing.T) {
	s := startSecureEtcd(t)
	ctx := ctxT(t, 60*time.Second)
	const key = "billing"
	fillQueue(t, s.root, key, 33)
	cfg := election.Config{Key: key, TTL: 2 * time.Second}
	newElector := func(id string) *election.Elector {
		c := cfg
		c.Identity = id
		e, err := election.New(etcdelect.New(s.dial(t, "billing", billingPassword)), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
	a, b, c := newElector("a"), newElector("b"), newElector("c")
	for i, e := range []*election.Elector{a, b, c} {
		if i == 0 {
			if _, err := e.Campaign(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ch := campaignAsync(ctx, t, e)
		waitPos(t, e, i)
		defer func() {
			select {
			case <-ch:
			case <-ctx.Done():
				t.Errorf("candidate %d not elected", i)
			}
		}()
	}
	// a's release and then b's: each is refused the record first.
	if err := a.Resign(ctx); err != nil {
		t.Fatalf("a's Resign with the record refused: %v", err)
	}
	waitFor(t, "b leads", func() bool { return b.IsLeader() })
	if err := b.Resign(ctx); err != nil {
		t.Fatalf("b's Resign with the record refused: %v", err)
	}
	waitFor(t, "c leads", func() bool { return c.IsLeader() })
	if r, err := s.root.Get(ctx, key+".tenure-released"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("handover record under a role that does not cover it: %v, %v", r, err)
	}
}

// TestConformance_EtcdHandoverOnEveryRelease runs the conformance suite
// with handover records written and read on every queue, however short:
// every release of a proven head records it, every waiter woken by a
// delete looks for it first.
func TestConformance_EtcdHandoverOnEveryRelease(t *testing.T) {
	electiontest.Run(t, newHarness(t, etcdelect.WithHandoverRecords(1)))
}
