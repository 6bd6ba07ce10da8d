package etcdelect_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

// rangeLog records the ranges a client sends, in Range and in Txn requests,
// and counts the watches the server confirmed created on its streams.
type rangeLog struct {
	mu sync.Mutex
	// inject, when set, is asked about each watch response the server
	// sends with events, and may change it before the client sees it.
	inject  func(*pb.WatchResponse)
	ranges  []*pb.RangeRequest
	created int
	puts    map[string]int // transactions that put the key, by key
	// loseReply, when set, is asked about each transaction after the
	// server answered it: true drops the answer and fails the call as a
	// lost reply would (codes.Unavailable).
	loseReply func(*pb.TxnRequest) bool
	// failBefore, when set, is asked about each transaction before it is
	// sent: true fails it unsent (codes.Unavailable).
	failBefore func(*pb.TxnRequest) bool
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
	wr, ok := m.(*pb.WatchResponse)
	if !ok || err != nil {
		return err
	}
	s.l.mu.Lock()
	if wr.Created {
		s.l.created++
	}
	inject := s.l.inject
	s.l.mu.Unlock()
	if inject != nil && len(wr.Events) > 0 {
		inject(wr)
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
			if p := op.GetRequestPut(); p != nil {
				if l.puts == nil {
					l.puts = map[string]int{}
				}
				l.puts[string(p.Key)]++
			}
		}
	}
	lose, fail := l.loseReply, l.failBefore
	l.mu.Unlock()
	if r, ok := req.(*pb.TxnRequest); ok && fail != nil && fail(r) {
		return status.Error(codes.Unavailable, "test: not sent")
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if r, ok := req.(*pb.TxnRequest); ok && err == nil && lose != nil && lose(r) {
		return status.Error(codes.Unavailable, "test: reply lost")
	}
	return err
}

// putsOf returns how many transactions put key.
func (l *rangeLog) putsOf(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.puts[key]
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
	return loggedElectorOn(t, clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}, key, id, opts...)
}

// loggedElectorOn is loggedElector on a client made from cfg.
func loggedElectorOn(t *testing.T, cfg clientv3.Config, key, id string, opts ...etcdelect.Option) (*election.Elector, *rangeLog) {
	t.Helper()
	l := &rangeLog{}
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(l.intercept), grpc.WithChainStreamInterceptor(l.interceptStream))
	cli, err := clientv3.New(cfg)
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
// read of its entry and that record, without a range over the queue; so
// does the one after it, whose predecessor was itself proven first by a
// record. On a short queue, and with records off (WithHandoverRecords(0)),
// the same successors range over the queue and no record is written.
func TestHandover_LongQueueSuccessorReadsNoQueue(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	for _, c := range []struct {
		name    string
		fill    bool
		records bool // expected
		opts    []etcdelect.Option
	}{
		{"long", true, true, nil},
		{"short", false, false, nil},
		{"long-records-off", true, false, []etcdelect.Option{etcdelect.WithHandoverRecords(0)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := electiontest.Key(t)
			rec := key + ".tenure-released"
			if c.fill {
				fillQueue(t, admin, key, 33)
			}
			ctx := ctxT(t, 30*time.Second)
			a, _ := loggedElector(t, key, "a", c.opts...)
			b, bl := loggedElector(t, key, "b", c.opts...)
			cc, cl := loggedElector(t, key, "c", c.opts...)
			ta, err := a.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			gotB := campaignAsync(ctx, t, b)
			// b waits on its own entry's watch and then on a's.
			waitFor(t, "b's two watches", func() bool { return bl.watches() >= 2 })
			gotC := campaignAsync(ctx, t, cc)
			waitFor(t, "c's two watches", func() bool { return cl.watches() >= 2 })
			fromB, fromC := bl.len(), cl.len()
			check := func(who string, l *rangeLog, from int, prev tenure.Term) {
				t.Helper()
				queueReads, recordReads := l.since(from, key+"/", rec)
				if c.records && (queueReads != 0 || recordReads == 0) {
					t.Fatalf("%s made %d queue reads and %d record reads from its predecessor's resign to its term; want 0 and at least 1", who, queueReads, recordReads)
				}
				if !c.records && (queueReads == 0 || recordReads != 0) {
					t.Fatalf("%s made %d queue reads and %d record reads; want some and 0", who, queueReads, recordReads)
				}
				r, err := admin.Get(ctx, rec)
				if err != nil {
					t.Fatal(err)
				}
				want := fmt.Sprintf("%d %s", prev.Token, prev.Entry)
				if c.records && (len(r.Kvs) != 1 || string(r.Kvs[0].Value) != want) {
					t.Fatalf("handover record = %v, want %q", r.Kvs, want)
				}
				if !c.records && len(r.Kvs) != 0 {
					t.Fatalf("handover record %v written", r.Kvs)
				}
			}
			if err := a.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			var tb tenure.Term
			select {
			case tb = <-gotB:
			case <-ctx.Done():
				t.Fatal("b not elected after a resigned")
			}
			check("b", bl, fromB, ta)
			if err := b.Resign(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case <-gotC:
			case <-ctx.Done():
				t.Fatal("c not elected after b resigned")
			}
			check("c", cl, fromC, tb)
			if !c.records {
				return
			}
			// The record lives on the releaser's lease: gone when b's
			// session ends.
			if err := b.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if r, err := admin.Get(ctx, rec); err != nil || len(r.Kvs) != 0 {
				t.Fatalf("handover record after the releaser closed: %v, %v", r.Kvs, err)
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

// TestHandover_StaleDeleteOfTheSameNameIsSkipped: a predecessor's entry is
// named after its lease, so an earlier campaign of its session made and
// deleted an entry of the same name. A watch served by a member that lags
// could show that old delete before the current entry's: waitDelete skips
// a delete older than its predecessor's entry and goes on to the events
// after it. Here the server's response that carries a's delete (a leads,
// w waits, a resigns with a record) gets such an old delete put in front
// of it. w must still be elected through a's record, without a range over
// the queue: one that ended its wait at the old delete would range over
// the queue (and, taking it for a's delete, also read the record).
func TestHandover_StaleDeleteOfTheSameNameIsSkipped(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	key := electiontest.Key(t)
	rec := key + ".tenure-released"
	fillQueue(t, admin, key, 33)
	ctx := ctxT(t, 30*time.Second)
	a, _ := loggedElector(t, key, "a")
	w, wl := loggedElector(t, key, "w")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	injected := make(chan struct{})
	var once sync.Once
	wl.mu.Lock()
	wl.inject = func(wr *pb.WatchResponse) {
		for _, ev := range wr.Events {
			if ev.Type == mvccpb.DELETE && string(ev.Kv.Key) == ta.Entry && ev.Kv.ModRevision > int64(ta.Token) {
				once.Do(func() {
					stale := &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(ta.Entry), ModRevision: int64(ta.Token) - 1}}
					wr.Events = append([]*mvccpb.Event{stale}, wr.Events...)
					close(injected)
				})
				return
			}
		}
	}
	wl.mu.Unlock()
	got := campaignAsync(ctx, t, w)
	waitFor(t, "w's two watches", func() bool { return wl.watches() >= 2 })
	from := wl.len()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("w not elected after a resigned")
	}
	select {
	case <-injected:
	default:
		t.Fatal("no old delete was put in front of a's: the test did not run")
	}
	if queueReads, recordReads := wl.since(from, key+"/", rec); queueReads != 0 || recordReads == 0 {
		t.Fatalf("w made %d queue reads and %d record reads from a's resign to its term; want 0 and at least 1", queueReads, recordReads)
	}
}

// TestHandover_OnlyARecordOfTheDeleteItselfElects: in a long queue where a
// leads and p and then w wait, p gives up its wait. p was never first, so
// its delete records no handover; a record naming p that another client
// wrote before that delete (at another revision) proves nothing either. w,
// woken by p's delete, must read the queue, find a, and wait for it.
func TestHandover_OnlyARecordOfTheDeleteItselfElects(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	l := lineUp(t, admin)
	if _, err := admin.Put(l.ctx, l.rec, fmt.Sprintf("%d %s", l.pToken, l.pName)); err != nil {
		t.Fatal(err)
	}
	from := l.wl.len()
	l.pcancel()
	if err := <-l.pdone; err == nil {
		t.Fatal("p's campaign returned nil after its ctx ended")
	}
	waitFor(t, "p's entry gone", func() bool {
		r, err := admin.Get(l.ctx, l.pName)
		return err == nil && len(r.Kvs) == 0
	})
	l.wWaitsForA(t, from)
}

// line is a long queue (33 keys that are not entries) where a leads, p
// waits behind a and w behind p, each with a logged client.
type line struct {
	ctx      context.Context
	key, rec string
	a, w     *election.Elector
	wl       *rangeLog
	pName    string
	pToken   int64
	pcancel  context.CancelFunc
	pdone    chan error         // p's campaign's error
	got      <-chan tenure.Term // w's term
}

func lineUp(t *testing.T, admin *clientv3.Client) *line {
	t.Helper()
	l := &line{key: electiontest.Key(t), pdone: make(chan error, 1)}
	l.rec = l.key + ".tenure-released"
	fillQueue(t, admin, l.key, 33)
	l.ctx = ctxT(t, 30*time.Second)
	var p *election.Elector
	l.a, _ = loggedElector(t, l.key, "a")
	p, _ = loggedElector(t, l.key, "p")
	l.w, l.wl = loggedElector(t, l.key, "w")
	if _, err := l.a.Campaign(l.ctx); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(l.ctx)
	t.Cleanup(pcancel)
	l.pcancel = pcancel
	go func() {
		_, err := p.Campaign(pctx)
		l.pdone <- err
	}()
	waitPos(t, p, 1)
	l.got = campaignAsync(l.ctx, t, l.w)
	waitFor(t, "w's two watches", func() bool { return l.wl.watches() >= 2 })
	l.pName, l.pToken = entryOf(t, admin, l.key, "p")
	return l
}

// wWaitsForA checks that w, woken by p's delete, read the record once and
// the queue, is not elected while a leads, and is once a resigns.
func (l *line) wWaitsForA(t *testing.T, from int) {
	t.Helper()
	select {
	case term := <-l.got:
		t.Fatalf("w elected (term %d) while a leads", term.Token)
	case <-time.After(500 * time.Millisecond):
	}
	if queueReads, recordReads := l.wl.since(from, l.key+"/", l.rec); queueReads == 0 || recordReads == 0 {
		t.Fatalf("w made %d queue reads and %d record reads after p's delete; want some of each", queueReads, recordReads)
	}
	if n, err := l.w.Position(l.ctx); err != nil || n != 1 {
		t.Fatalf("w's position = %d, %v; want 1 (behind a)", n, err)
	}
	if err := l.a.Resign(l.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.got:
	case <-l.ctx.Done():
		t.Fatal("w not elected after a resigned")
	}
}

// TestHandover_ARecordOfTheDeleteNamingAnotherEntryDoesNotElect: another
// client deletes p's entry (p waits behind a, w behind p) and, in the same
// transaction, writes a record that does not name p: p's name with another
// token (a previous entry of p's session), or p's token with another name.
// The record is of the delete's revision, but it does not name w's
// predecessor: w must read the queue, find a, and wait for it.
func TestHandover_ARecordOfTheDeleteNamingAnotherEntryDoesNotElect(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	for _, c := range []struct {
		name  string
		value func(name string, token int64) string
	}{
		{"other-token", func(name string, token int64) string { return fmt.Sprintf("%d %s", token-1, name) }},
		{"other-name", func(name string, token int64) string { return fmt.Sprintf("%d %s0", token, name) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := lineUp(t, admin)
			from := l.wl.len()
			r, err := admin.Txn(l.ctx).
				If(clientv3.Compare(clientv3.CreateRevision(l.pName), "=", l.pToken)).
				Then(clientv3.OpDelete(l.pName), clientv3.OpPut(l.rec, c.value(l.pName, l.pToken))).
				Commit()
			if err != nil || !r.Succeeded {
				t.Fatalf("delete p with a record: %v, %v", r, err)
			}
			l.wWaitsForA(t, from)
			if err := <-l.pdone; err == nil {
				t.Fatal("p's campaign returned nil with its entry deleted")
			}
		})
	}
}

// TestHandover_RecordRefusedByTheRoleStillReleases: a role that covers
// "<key>/" and may read "<key>.tenure-released" but not write it (key
// "billing" with readwrite on "billing/", docs/security.md, and read on the
// record) refuses the record. Each release tries it once, is refused, and
// deletes the entry alone; the next waiter leads after reading the queue.
// A role that may not even read the record gives the same result (a's
// first release, b's read of the record).
func TestHandover_RecordRefusedByTheRoleStillReleases(t *testing.T) {
	s := startSecureEtcd(t)
	ctx := ctxT(t, 60*time.Second)
	const key = "billing"
	rec := key + ".tenure-released"
	fillQueue(t, s.root, key, 33)
	for _, readable := range []bool{false, true} {
		t.Run(fmt.Sprintf("readable=%v", readable), func(t *testing.T) {
			if readable {
				if _, err := s.root.RoleGrantPermission(ctx, "tenure-billing", rec, "", clientv3.PermissionType(clientv3.PermRead)); err != nil {
					t.Fatal(err)
				}
			}
			cfg := s.config(t, "billing", billingPassword)
			var es []*election.Elector
			var ls []*rangeLog
			for _, id := range []string{"a", "b", "c"} {
				e, l := loggedElectorOn(t, cfg, key, id)
				es, ls = append(es, e), append(ls, l)
			}
			if _, err := es[0].Campaign(ctx); err != nil {
				t.Fatal(err)
			}
			var chs []<-chan tenure.Term
			for i, e := range es[1:] {
				chs = append(chs, campaignAsync(ctx, t, e))
				// Waiting on its own entry's watch and its predecessor's,
				// so that the predecessor's delete wakes it: a waiter that
				// finds it gone before its watch starts reads the queue
				// without looking for the record, and is never refused.
				waitFor(t, "the waiter's two watches", func() bool { return ls[i+1].watches() >= 2 })
			}
			for i, e := range es[:2] {
				if err := e.Resign(ctx); err != nil {
					t.Fatalf("%s's Resign with the record refused: %v", []string{"a", "b"}[i], err)
				}
				select {
				case <-chs[i]:
				case <-ctx.Done():
					t.Fatalf("candidate %d not elected", i+1)
				}
			}
			if n := ls[0].putsOf(rec); n != 1 {
				t.Fatalf("a's session sent %d transactions with the record; want 1 (refused)", n)
			}
			if want := map[bool]int{false: 0, true: 1}[readable]; ls[1].putsOf(rec) != want {
				// Not readable: b's read of the record was refused first,
				// and its session gave records up before its release.
				t.Fatalf("b's session sent %d transactions with the record; want %d", ls[1].putsOf(rec), want)
			}
			if r, err := s.root.Get(ctx, rec); err != nil || len(r.Kvs) != 0 {
				t.Fatalf("handover record under a role that may not write it: %v, %v", r, err)
			}
			if err := es[2].Resign(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestHandover_ReleaseWhoseReplyIsLostStillReleases: the reply to a
// release's transaction (delete and record) is lost after the server
// applied it; and, in the second case, the transaction fails before it is
// sent. Either way Resign returns nil, the entry is gone and the next
// waiter leads: after the record in the first case, after reading the
// queue in the second.
func TestHandover_ReleaseWhoseReplyIsLostStillReleases(t *testing.T) {
	admin := newClient(t, endpoint)
	defer admin.Close()
	for _, applied := range []bool{true, false} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			key := electiontest.Key(t)
			rec := key + ".tenure-released"
			fillQueue(t, admin, key, 33)
			ctx := ctxT(t, 30*time.Second)
			a, al := loggedElector(t, key, "a")
			b, bl := loggedElector(t, key, "b")
			ta, err := a.Campaign(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := campaignAsync(ctx, t, b)
			waitFor(t, "b's two watches", func() bool { return bl.watches() >= 2 })
			from := bl.len()
			isRecord := func(r *pb.TxnRequest) bool {
				for _, op := range r.Success {
					if p := op.GetRequestPut(); p != nil && string(p.Key) == rec {
						return true
					}
				}
				return false
			}
			al.mu.Lock()
			if applied {
				al.loseReply = isRecord
			} else {
				al.failBefore = isRecord
			}
			al.mu.Unlock()
			if err := a.Resign(ctx); err != nil {
				t.Fatalf("Resign after the release's reply was lost: %v", err)
			}
			select {
			case <-got:
			case <-ctx.Done():
				t.Fatal("b not elected after a resigned")
			}
			if r, err := admin.Get(ctx, ta.Entry); err != nil || len(r.Kvs) != 0 {
				t.Fatalf("a's entry after Resign: %v, %v", r, err)
			}
			queueReads, recordReads := bl.since(from, key+"/", rec)
			r, err := admin.Get(ctx, rec)
			if err != nil {
				t.Fatal(err)
			}
			if applied && (queueReads != 0 || recordReads == 0 || len(r.Kvs) != 1) {
				t.Fatalf("applied: b made %d queue and %d record reads, %d records; want 0, at least 1, 1", queueReads, recordReads, len(r.Kvs))
			}
			if !applied && (queueReads == 0 || len(r.Kvs) != 0) {
				t.Fatalf("not sent: b made %d queue reads, %d records; want some, 0", queueReads, len(r.Kvs))
			}
		})
	}
}

// TestConformance_EtcdHandoverOnEveryRelease runs the conformance suite
// with handover records written and read on every queue, however short:
// every release of a proven head records it, every waiter woken by a
// delete looks for it first.
func TestConformance_EtcdHandoverOnEveryRelease(t *testing.T) {
	electiontest.Run(t, newHarness(t, etcdelect.WithHandoverRecords(1)))
}
