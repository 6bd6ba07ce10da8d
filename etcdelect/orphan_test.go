package etcdelect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

// TestEnqueue_GivenUpUndeletableEntryEndsTheSession: a campaign given up
// while its put is in flight ends its session, so that its lease (and the
// entry the put may have made) goes: the entry's name is the session's, and
// a session kept alive would keep at the head of the queue an entry that no
// campaign knows of, for as long as the process runs. When the revoke is
// refused too, the lease, no longer renewed, must expire.
//
// The put goes through a proxy that holds every byte for 1 s; the campaign
// gives up after 600 ms, while the put is on its way. As soon as the put
// lands, the service's role loses its write permission, so the revoke,
// behind the put, is refused (etcd lets only a user who may write every key
// of a lease revoke it); then the permission is back.
func TestEnqueue_GivenUpUndeletableEntryEndsTheSession(t *testing.T) {
	const key = "billing/given-up"
	s, p, e, ctx := billingBehindProxy(t, key, 10*time.Second)

	p.Delay(time.Second)
	cctx, giveUp := context.WithTimeout(ctx, 600*time.Millisecond)
	defer giveUp()
	done := make(chan error, 1)
	go func() {
		_, err := e.Campaign(cctx)
		done <- err
	}()
	waitFor(t, "the put to land", func() bool { return len(s.keys(t, key+"/")) == 1 })
	role, prefix := "tenure-billing", "billing/"
	if _, err := s.root.RoleRevokePermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("Campaign given up = %v, want ErrCanceled", err)
	}
	if _, err := s.root.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	p.Delay(0)
	// Within a TTL: the ended session's lease is revoked at once when the
	// link allows, and expires a TTL after its last renewal otherwise.
	deadline := time.Now().Add(12 * time.Second)
	for len(s.keys(t, key+"/")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the given-up campaign's entry %v still stands 12 s on: its session lives on", s.keys(t, key+"/"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTryPolling_KeepsNoWatchBacklog: a session keeps its watch on its
// entry name across campaigns. A standby that polls TryCampaign puts and
// deletes its entry on every refused try, two events for that watch, which
// nobody reads until the next won term: the client would hold them all,
// growing for as long as the standby polls. Each Enqueue reads what is
// pending first.
func TestTryPolling_KeepsNoWatchBacklog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli := newClient(t, endpoint)
	defer cli.Close()
	b := etcdelect.New(cli)
	key := electiontest.Key(t)
	open := func() election.Session {
		s, err := b.OpenSession(ctx, election.SessionOptions{TTL: 5 * time.Second, RenewInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()) })
		return s
	}
	poller, holder := open(), open()
	// The poller leads once: its watch on its entry name now exists.
	won, err := poller.Enqueue(ctx, key, "poller")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := poller.WaitHead(ctx, won); err != nil {
		t.Fatal(err)
	}
	if err := poller.Dequeue(ctx, won); err != nil {
		t.Fatal(err)
	}
	held, err := holder.Enqueue(ctx, key, "holder")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.WaitHead(ctx, held); err != nil {
		t.Fatal(err)
	}
	// TryCampaign's steps, refused every time.
	const tries = 500
	for i := range tries {
		tk, err := poller.Enqueue(ctx, key, "poller")
		if err != nil {
			t.Fatal(err)
		}
		if n, err := poller.Ahead(ctx, tk); err != nil || n != 1 {
			t.Fatalf("try %d: Ahead = %d, %v; want 1 (the holder)", i, n, err)
		}
		if err := poller.Dequeue(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	backlog := etcdelect.OwnWatchBacklog(poller, key)
	t.Logf("watch responses pending after %d refused tries: %d", tries, backlog)
	if backlog < 0 {
		t.Fatal("the poller's session has no watch on its entry name: the test shows nothing")
	}
	if backlog > 50 {
		t.Fatalf("%d watch responses pending after %d refused tries: the client holds every try's events", backlog, tries)
	}
	// The watch still serves: a won term sees its entry deleted.
	tk, err := poller.Enqueue(ctx, key, "poller")
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Dequeue(ctx, held); err != nil {
		t.Fatal(err)
	}
	if _, err := poller.WaitHead(ctx, tk); err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	go func() { lost <- poller.WatchLoss(ctx, tk) }()
	if _, err := cli.Delete(ctx, tk.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, tenure.ErrOwnershipLost) {
			t.Fatalf("WatchLoss after the entry's delete = %v, want ErrOwnershipLost", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WatchLoss did not see the entry's delete within 5 s")
	}
}

// TestEnqueue_GivenUpPutThatLandsLateLeavesNoEntry: the client spreads its
// requests over its endpoints, so a put given up in flight on a slow one
// can land after a clean-up delete sent on a fast one: the delete finds
// nothing, and the put then makes an entry under the session's live lease
// that no campaign knows of, at the head of the queue for as long as the
// session lives. A given-up put must end the session and revoke its lease,
// which refuses the put whenever it lands.
//
// Two proxies lead to the one server; on each try one of them, in turn,
// holds every byte for 1 s (the client's choice of endpoint for the put
// may stay the same for a whole run). Each try opens a session, arms the
// delay and gives the put 300 ms; whichever endpoint the put and the
// clean-up take, no entry may stand once the held bytes have arrived.
func TestEnqueue_GivenUpPutThatLandsLateLeavesNoEntry(t *testing.T) {
	ctx := ctxT(t, 120*time.Second)
	key := electiontest.Key(t)
	var proxies [2]*faultproxy.Proxy
	for i := range proxies {
		p, err := faultproxy.New(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		proxies[i] = p
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{proxies[0].Addr(), proxies[1].Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	admin := newClient(t, endpoint)
	defer admin.Close()
	defer admin.Delete(context.Background(), key+"/", clientv3.WithPrefix())
	b := etcdelect.New(cli)
	gaveUp := 0
	for try := range 12 {
		s, err := b.OpenSession(ctx, election.SessionOptions{TTL: 10 * time.Second, RenewInterval: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		slow := proxies[try%2]
		slow.Delay(time.Second)
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		tk, enqErr := s.Enqueue(cctx, key, "a")
		cancel()
		slow.Delay(0)
		time.Sleep(1500 * time.Millisecond) // the held bytes arrive
		if enqErr == nil {
			if err := s.Dequeue(ctx, tk); err != nil {
				t.Fatal(err)
			}
		} else {
			gaveUp++
			r, err := admin.Get(ctx, key+"/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Kvs) > 0 {
				t.Fatalf("try %d: Enqueue gave up (%v), yet entry %s (lease %x) stands 1.5 s later", try, enqErr, r.Kvs[0].Key, r.Kvs[0].Lease)
			}
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if gaveUp == 0 {
		t.Fatal("no Enqueue gave up: neither endpoint ever held a put")
	}
	t.Logf("%d of 12 puts given up in flight, no entry left", gaveUp)
}

// TestEnqueue_RefusedRetryAfterALostReplyLeavesNoEntry: a put lands but
// its reply is lost (the connection is cut); the retry is refused, the
// service's role having lost its permission meanwhile. The refusal says
// nothing of the first put, whose entry stood under the live, renewed
// session for as long as the elector lived, an entry no campaign knew of.
// Enqueue now gives the session up, so the entry goes with its lease.
func TestEnqueue_RefusedRetryAfterALostReplyLeavesNoEntry(t *testing.T) {
	const key = "billing/refused-retry"
	const ttl = 3 * time.Second
	s, p, e, ctx := billingBehindProxy(t, key, ttl)

	p.Delay(time.Second) // the put's reply comes 1 s after the put lands
	done := make(chan error, 1)
	go func() {
		_, err := e.Campaign(ctx)
		done <- err
	}()
	waitFor(t, "the put to land", func() bool { return len(s.keys(t, key+"/")) == 1 })
	role, prefix := "tenure-billing", "billing/"
	if _, err := s.root.RoleRevokePermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix)); err != nil {
		t.Fatal(err)
	}
	p.Cut() // the reply, still held, is lost
	p.Delay(0)
	if err := <-done; !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Campaign whose retry is refused = %v, want ErrInvalidConfig", err)
	}
	if _, err := s.root.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	// The revoke of the given-up session is refused (the permission was
	// gone): the lease expires a TTL after its last renewal.
	deadline := time.Now().Add(ttl + 3*time.Second)
	for len(s.keys(t, key+"/")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the first put's entry %v still stands %v after the refusal: its session lives on", s.keys(t, key+"/"), ttl+3*time.Second)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// billingBehindProxy starts a secure etcd and an elector on key, as the
// billing service's user, whose client reaches the server through a fault
// proxy; a first term, resigned, has opened the session the next campaign
// reuses, so that its first request is its put.
func billingBehindProxy(t *testing.T, key string, ttl time.Duration) (*secureEtcd, *faultproxy.Proxy, *election.Elector, context.Context) {
	t.Helper()
	s := startSecureEtcd(t)
	p, err := faultproxy.New(s.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	cfg := s.config(t, "billing", billingPassword)
	cfg.Endpoints = []string{p.Addr()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx := ctxT(t, 60*time.Second)
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	return s, p, e, ctx
}
