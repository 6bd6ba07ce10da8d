package etcdelect_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

func TestBadInput_EtcdKeysRefused(t *testing.T) {
	b := etcdelect.New(nil)
	for _, k := range []string{"", "a\x00b", "a\nb", "a\x7fb", "\xff\xfe", strings.Repeat("k", etcdelect.MaxKeyLen+1)} {
		if _, err := election.New(b, election.Config{Key: k, TTL: 2 * time.Second}); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("election.New with key %q = %v, want ErrInvalidConfig", k, err)
		}
	}
}

// TestBadInput_EtcdNilClient: a Backend made with a nil client is refused
// by election.New, and its own calls return ErrInvalidConfig. Before,
// New accepted it and Campaign panicked, and Observe panicked in its own
// goroutine, killing the process.
func TestBadInput_EtcdNilClient(t *testing.T) {
	b := etcdelect.New(nil)
	ctx := ctxT(t, 5*time.Second)
	if _, err := election.New(b, election.Config{Key: "k", TTL: 2 * time.Second}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("election.New on etcdelect.New(nil) = %v, want ErrInvalidConfig", err)
	}
	if _, err := b.Leader(ctx, "k"); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("Leader = %v, want ErrInvalidConfig", err)
	}
	if err := b.Observe(ctx, "k", func(tenure.Leader) {}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("Observe = %v, want ErrInvalidConfig", err)
	}
	if _, err := b.OpenSession(ctx, election.SessionOptions{TTL: 2 * time.Second, RenewInterval: time.Second}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("OpenSession = %v, want ErrInvalidConfig", err)
	}
}

// TestBadInput_EtcdIdentityTooLarge: an Identity over the client's
// request limit is refused at once with ErrInvalidConfig. Before, the
// oversized put read as the server being unavailable, and Campaign
// retried it until its context ended.
func TestBadInput_EtcdIdentityTooLarge(t *testing.T) {
	cli := newClient(t, endpoint)
	defer cli.Close()
	e, err := election.New(etcdelect.New(cli), election.Config{Key: electiontest.Key(t), Identity: strings.Repeat("x", 3<<20), TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	start := time.Now()
	_, err = e.Campaign(ctxT(t, 10*time.Second))
	if !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Campaign with a 3 MiB Identity: %v after %v, want ErrInvalidConfig", err, time.Since(start))
	}
	t.Logf("refused after %v: %v", time.Since(start).Round(time.Millisecond), err)
}

func allKeys(t *testing.T, cli *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := cli.Get(ctxT(t, 10*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// TestBadInput_EtcdGarbageUnderThePrefixIsNotAContender: keys another client
// put under the election's prefix, older than every candidate — without a
// lease, under a lease that is not the one their name says, or with names
// that are no lease ID — neither block the queue nor show as leader, and
// tenure neither reads them as terms nor deletes them.
func TestBadInput_EtcdGarbageUnderThePrefixIsNotAContender(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin := newClient(t, endpoint)
	defer admin.Close()
	lease, err := admin.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Revoke(context.Background(), lease.ID)
	garbage := map[string]clientv3.OpOption{
		key + "/1":              nil,                          // a lease ID's name, no lease: would never expire
		key + "/garbage":        nil,                          // not a lease ID
		key + "/ABCDEF":         clientv3.WithLease(lease.ID), // upper case: not what %x writes
		key + "/2":              clientv3.WithLease(lease.ID), // a lease, but not lease 2
		key + "/":               nil,                          // empty name
		key + "/00" + "1":       nil,                          // leading zeros
		key + "/\xff\x00binary": nil,                          // binary name
	}
	var names []string
	for k, opt := range garbage {
		var opts []clientv3.OpOption
		if opt != nil {
			opts = append(opts, opt)
		}
		if _, err := admin.Put(ctx, k, "\x1b[31mnot an identity\x00", opts...); err != nil {
			t.Fatal(err)
		}
		names = append(names, k)
	}
	slices.Sort(names)
	cli := newClient(t, endpoint)
	defer cli.Close()
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "tenure", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if l, err := e.Leader(ctx); err != nil || !l.Vacant {
		t.Fatalf("Leader with only garbage under the prefix = %+v, %v; want vacant", l, err)
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	term, err := e.TryCampaign(tctx)
	if err != nil {
		t.Fatalf("TryCampaign behind garbage = %v, want elected", err)
	}
	// One look at the keys off their leases, a TTL in, skips them all:
	// 8166ff8 looked at them one at a time, a TTL each (2 here).
	if took := time.Since(began); took > 3*time.Second {
		t.Fatalf("TryCampaign behind two entry-named keys off their leases took %v, want one TTL (2s)", took.Round(time.Millisecond))
	}
	if l, err := e.Leader(ctx); err != nil || l.Term.Token != term.Token || l.Term.Identity != "tenure" {
		t.Fatalf("Leader = %+v, %v; want tenure at %d", l, err, term.Token)
	}
	if n, err := e.Position(ctx); err != nil || n != 0 {
		t.Fatalf("Position = %d, %v; want 0", n, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if got := allKeys(t, admin, key+"/"); !slices.Equal(got, names) {
		t.Fatalf("keys after resign = %q, want the garbage only, untouched: %q", got, names)
	}
}

// TestBadInput_EtcdLeaselessEntryNameIsSkipped: a key put by hand under the
// prefix with an entry's name ("<key>/<hex>") but no lease, newer than any
// other key, is read keys-only as a predecessor; it never goes away, so its
// lease is checked once the wait outlives a TTL, and the candidate leads
// then, skipping it (it is never deleted).
func TestBadInput_EtcdLeaselessEntryNameIsSkipped(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin := newClient(t, endpoint)
	defer admin.Close()
	if _, err := admin.Put(ctx, key+"/1", "by hand"); err != nil {
		t.Fatal(err)
	}
	cli := newClient(t, endpoint)
	defer cli.Close()
	const ttl = 2 * time.Second
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "tenure", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	start := time.Now()
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatalf("Campaign behind a leaseless key: %v", err)
	}
	took := time.Since(start)
	t.Logf("elected %v after campaigning behind a leaseless key named like an entry (TTL %v)", took, ttl)
	if took > ttl+time.Second {
		t.Fatalf("elected after %v, want within TTL + 1 s", took)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// A second campaign of the same session remembers the key: no wait.
	start = time.Now()
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > ttl/2 {
		t.Fatalf("second campaign waited %v behind the known leaseless key", took)
	}
	if got := allKeys(t, admin, key+"/"); len(got) != 2 || got[0] != key+"/1" {
		t.Fatalf("keys = %q: want the hand-put key untouched and the leader's", got)
	}
}

// TestBadInput_EtcdLeaderEntryDetachedFromItsLease: a put of the leader's
// own entry without its lease (etcdctl put <entry> x) keeps the entry's
// create revision but detaches it from the session: the waiters stop
// counting it as an entry (after a TTL, see the test above) and the next
// one leads. The leader must count the entry lost at once, and so never
// lead beside its successor.
func TestBadInput_EtcdLeaderEntryDetachedFromItsLease(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin, elector := detachSetup(t, key)
	const ttl = detachTTL
	a, b := elector("a"), elector("b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type win struct {
		term tenure.Term
		at   time.Time
	}
	elected := make(chan win, 1)
	go func() {
		if tb, err := b.Campaign(ctx); err == nil {
			elected <- win{tb, time.Now()}
		}
	}()
	waitPos(t, b, 1)
	detached := time.Now()
	if _, err := admin.Put(ctx, ta.Entry, "a"); err != nil { // no lease
		t.Fatal(err)
	}
	var aEnded time.Time
	select {
	case <-a.Done():
		aEnded = time.Now()
		t.Logf("a's term ended %v after its entry was detached: %v", aEnded.Sub(detached), a.Err())
	case <-time.After(ttl):
		t.Fatalf("a still leads %v after its entry was detached from its lease", ttl)
	}
	if !errors.Is(a.Err(), tenure.ErrOwnershipLost) {
		t.Fatalf("a's term ended with %v, want ErrOwnershipLost", a.Err())
	}
	select {
	case eb := <-elected:
		tb := eb.term
		t.Logf("b elected %v after the detachment", eb.at.Sub(detached))
		if !aEnded.Before(eb.at) {
			t.Fatalf("two leaders: b (token %d) was elected %v before a's term (token %d) ended", tb.Token, aEnded.Sub(eb.at), ta.Token)
		}
		if tb.Token <= ta.Token {
			t.Fatalf("b's token %d is not above a's %d", tb.Token, ta.Token)
		}
	case <-time.After(3 * ttl):
		t.Fatalf("b not elected within %v of the detachment", 3*ttl)
	}
}

// TestClosedClient_IsErrClosed: with its etcd client closed (by a program
// that closed it before its electors), the backend's requests fail with
// ErrClosed, and Run returns it at once. Before, they failed with
// ErrUnavailable, and Run retried every RetryInterval until its ctx ended.
func TestClosedClient_IsErrClosed(t *testing.T) {
	cli := newClient(t, endpoint)
	b := etcdelect.New(cli)
	key := "/closed-client/" + t.Name()
	e, err := election.New(b, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.Leader(ctx, key); !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("Leader on a closed client: %v, want ErrClosed", err)
	}
	begun := time.Now()
	if err := e.Run(ctx, tenure.Callbacks{}); !errors.Is(err, tenure.ErrClosed) || time.Since(begun) > 2*time.Second {
		t.Fatalf("Run on a closed client: %v after %v, want ErrClosed at once", err, time.Since(begun))
	}
}

// TestBadInput_DetachedEntryOfADeadLeaderIsSkipped: the leader's entry is
// detached from its lease (etcdctl put <entry> x) after its waiter has
// already checked that entry's lease, and the leader dies at once, before
// it can delete it. The detached key never expires; the waiter must stop
// counting it and lead. Before, the put event (same create revision) was
// ignored and the waiter waited for good.
func TestBadInput_DetachedEntryOfADeadLeaderIsSkipped(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := electiontest.Key(t)
	admin := newClient(t, endpoint)
	defer admin.Close()
	defer admin.Delete(context.Background(), key+"/", clientv3.WithPrefix())
	const ttl = detachTTL
	acli := newClient(t, endpoint)
	a, err := election.New(etcdelect.New(acli), election.Config{Key: key, Identity: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	bcli := newClient(t, endpoint)
	defer bcli.Close()
	b, err := election.New(etcdelect.New(bcli), election.Config{Key: key, Identity: "b", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elected := campaignAt(ctx, b)
	waitPos(t, b, 1)
	time.Sleep(2 * ttl) // past b's one look at a's lease
	// a dies as its entry is detached: its client goes, with no delete.
	acli.Close()
	defer a.Close(context.Background())
	detached := time.Now()
	if _, err := admin.Put(ctx, ta.Entry, "a"); err != nil { // no lease
		t.Fatal(err)
	}
	awaitElectedAfterDetach(t, elected, detached)
}

// TestBadInput_DetachJustBeforeTheWaitersLeaseCheckWaitsATTL: the
// waiter's one look at its predecessor's lease is due a TTL into its
// wait; a detach just before that must still give the holder a full TTL
// from the detach (a holder cut off from etcd learns of it only at its
// deadline). Before, the look already due found the key detached and the
// waiter led 0.3 s after the detach.
func TestBadInput_DetachJustBeforeTheWaitersLeaseCheckWaitsATTL(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin, elector := detachSetup(t, key)
	const ttl = detachTTL
	a, b := elector("a"), elector("b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elected := campaignAt(ctx, b)
	waitPos(t, b, 1)
	time.Sleep(ttl - 300*time.Millisecond)
	detached := time.Now()
	if _, err := admin.Put(ctx, ta.Entry, "a"); err != nil { // no lease
		t.Fatal(err)
	}
	awaitElectedAfterDetach(t, elected, detached)
}

// TestBadInput_DetachSeenByAFullReadWaitsATTL: a waiter that arrives after
// the leader's entry was detached, when the newest key older than its own
// is not an entry (a nested election's), reads the queue with leases. The
// detached entry must still give its holder a TTL (cut off from etcd, it
// may lead until its deadline). Before, that read dropped it at once and
// the waiter led at once.
func TestBadInput_DetachSeenByAFullReadWaitsATTL(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin, elector := detachSetup(t, key)
	const ttl = detachTTL
	a, b := elector("a"), elector("b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Put(ctx, key+"/nested/x", "another election's"); err != nil {
		t.Fatal(err)
	}
	detached := time.Now()
	if _, err := admin.Put(ctx, ta.Entry, "a"); err != nil { // no lease
		t.Fatal(err)
	}
	if _, err := b.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(detached); took < ttl*9/10 {
		t.Fatalf("b elected %v after a's entry was detached: a holder cut off from etcd could still lead for up to a TTL (%v)", took.Round(time.Millisecond), ttl)
	}
	t.Logf("b elected %v after the detach", time.Since(detached).Round(time.Millisecond))
}

// detachTTL is the TTL of the detach tests' electors.
const detachTTL = 2 * time.Second

// detachSetup returns an admin client for key's prefix (its keys deleted
// at the test's end) and a maker of electors on key with TTL detachTTL,
// each on its own client, closed at the test's end.
func detachSetup(t *testing.T, key string) (*clientv3.Client, func(id string) *election.Elector) {
	t.Helper()
	admin := newClient(t, endpoint)
	t.Cleanup(func() {
		admin.Delete(context.Background(), key+"/", clientv3.WithPrefix())
		admin.Close()
	})
	return admin, func(id string) *election.Elector {
		cli := newClient(t, endpoint)
		t.Cleanup(func() { cli.Close() })
		e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: id, TTL: detachTTL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
}

// campaignAt runs e.Campaign in the background and sends when it won.
func campaignAt(ctx context.Context, e *election.Elector) <-chan time.Time {
	elected := make(chan time.Time, 1)
	go func() {
		if _, err := e.Campaign(ctx); err == nil {
			elected <- time.Now()
		}
	}()
	return elected
}

// awaitElectedAfterDetach waits for the waiter's election (elected) and
// fails unless it came most of a TTL after detached (a holder cut off
// from etcd may lead until its deadline) and within four TTLs (a key no
// lease ends must not hold the queue).
func awaitElectedAfterDetach(t *testing.T, elected <-chan time.Time, detached time.Time) {
	t.Helper()
	select {
	case at := <-elected:
		took := at.Sub(detached)
		t.Logf("b elected %v after the detach", took.Round(time.Millisecond))
		if took < detachTTL*9/10 {
			t.Fatalf("b elected %v after a's entry was detached: a holder cut off from etcd could still lead for up to a TTL (%v)", took.Round(time.Millisecond), detachTTL)
		}
	case <-time.After(4 * detachTTL):
		t.Fatalf("b not elected %v after a's entry was detached: it waits on a key no lease ends", 4*detachTTL)
	}
}

// TestBadInput_LeaselessKeyRewrittenOftenIsStillSkipped: another program
// keeps a key named like an entry ("<key>/42", no lease) ahead of the
// queue and rewrites it every 300 ms. Each rewrite pushed the waiter's
// lease check back a full TTL, so the check never came and the queue
// stopped behind the key for as long as it was rewritten. A look is now
// re-armed only when a key is detached from its lease, not when a key
// off one already is written again: the waiter leads within a few TTLs.
func TestBadInput_LeaselessKeyRewrittenOftenIsStillSkipped(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin, elector := detachSetup(t, key)
	if _, err := admin.Put(ctx, key+"/42", "0"); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for i := 1; wctx.Err() == nil; i++ {
			admin.Put(wctx, key+"/42", fmt.Sprint(i))
			select {
			case <-wctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	e := elector("tenure")
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*detachTTL)
	defer cancel()
	if _, err := e.Campaign(cctx); err != nil {
		t.Fatalf("Campaign behind a leaseless key rewritten every 300 ms: %v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	took := time.Since(start)
	t.Logf("elected %v after campaigning behind a leaseless key rewritten every 300 ms (TTL %v)", took.Round(time.Millisecond), detachTTL)
	if took > 3*detachTTL {
		t.Fatalf("elected after %v, want within 3 TTLs", took)
	}
}

// TestBadInput_DetachedEntryRewrittenWaitsATTLFromTheDetach: a leader's
// entry detached from its lease and then rewritten every 300 ms: the
// waiter leads a TTL after the detach (its holder, cut off, may lead
// until its deadline), not never.
func TestBadInput_DetachedEntryRewrittenWaitsATTLFromTheDetach(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := electiontest.Key(t)
	admin, elector := detachSetup(t, key)
	a, b := elector("a"), elector("b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elected := campaignAt(ctx, b)
	waitPos(t, b, 1)
	detached := time.Now()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for i := 0; wctx.Err() == nil; i++ {
			admin.Put(wctx, ta.Entry, fmt.Sprint(i)) // no lease
			select {
			case <-wctx.Done():
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	awaitElectedAfterDetach(t, elected, detached)
}
