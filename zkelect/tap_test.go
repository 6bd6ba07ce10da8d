package zkelect_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

// TestTap_TokenIsTheNodesCzxid: Enqueue takes its token from the zxid of
// the create's reply, read off the wire, instead of reading the node back.
// That zxid must be the node's czxid, and the reply's session its owner,
// while creates and deletes of other connections commit in between. With
// the tap turned off, Enqueue reads each node back and gets the same.
func TestTap_TokenIsTheNodesCzxid(t *testing.T) {
	raw := rawConn(t, "", "")
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var dials atomic.Int32
	viaDialer := zkelect.WithDialer(func(network, address string, timeout time.Duration) (net.Conn, error) {
		dials.Add(1)
		return net.DialTimeout(network, address, timeout)
	})
	type backend struct {
		b      *zkelect.Backend
		tapped bool
	}
	var bs []backend
	for i := range 4 {
		var opts []zkelect.Option
		if i == 1 {
			opts = append(opts, viaDialer) // the tap wraps a caller's dialer too
		}
		b, err := zkelect.Dial(ctx, server.Endpoints(), ttl, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		tapped := i != 3
		if !tapped {
			zkelect.DisableTap(b)
		}
		bs = append(bs, backend{b, tapped})
	}
	if dials.Load() == 0 {
		t.Fatal("the caller's dialer was not used")
	}
	const perSession = 40
	var wg sync.WaitGroup
	var enqueued atomic.Int32
	for i, be := range bs {
		for j := range 3 {
			sess, err := be.b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sess.Close(context.Background()) })
			wg.Go(func() {
				checked := enqueueAndCheck(t, ctx, raw, be.b, sess, key, perSession, fmt.Sprintf("backend %d session %d, tap on: %v", i, j, be.tapped))
				enqueued.Add(int32(checked))
			})
		}
	}
	wg.Wait()
	if got, want := enqueued.Load(), int32(len(bs)*3*perSession); got != want {
		t.Fatalf("%d enqueues checked, want %d", got, want)
	}
	for i, be := range bs {
		misses := zkelect.TapMisses(be.b)
		switch {
		case be.tapped && misses != 0:
			t.Errorf("backend %d: %d of its creates were read back: the tap missed their replies", i, misses)
		case !be.tapped && misses != 3*perSession:
			t.Errorf("backend %d, tap off: %d creates read back, want %d", i, misses, 3*perSession)
		}
	}
}

// TestTap_TokenOnEveryServerOfAnEnsemble: a follower answers a create
// after it has applied the leader's commit; the zxid of its reply must be
// the node's czxid too. One candidate per server of a three-server
// ensemble, creating at once.
func TestTap_TokenOnEveryServerOfAnEnsemble(t *testing.T) {
	ens, err := zkserver.Start(t.TempDir(), zkserver.Options{Servers: 3, MaxSessionTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ens.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, _, err := zk.Connect(ens.Endpoints(), ttl, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	leader, err := ens.Leader()
	if err != nil {
		t.Fatal(err)
	}
	key := electiontest.Key(t)
	const each = 30
	var wg sync.WaitGroup
	for i, ep := range ens.Endpoints() {
		b, err := zkelect.Dial(ctx, []string{ep}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		sess, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close(context.Background())
		wg.Go(func() {
			enqueueAndCheck(t, ctx, admin, b, sess, key, each, fmt.Sprintf("server %d, leader: %v", i, i == leader))
			if m := zkelect.TapMisses(b); m != 0 {
				t.Errorf("server %d: %d creates read back: the tap missed their replies", i, m)
			}
		})
	}
	wg.Wait()
}

// enqueueAndCheck enqueues and dequeues n times on sess, and checks each
// ticket's token and owner against its node's Stat, read through raw
// after a sync (raw may use another server). It returns how many it
// checked; it reports failures with t.Errorf, so it may run in a
// goroutine.
func enqueueAndCheck(t *testing.T, ctx context.Context, raw *zk.Conn, b *zkelect.Backend, sess election.Session, key string, n int, what string) int {
	checked := 0
	for i := range n {
		tk, err := sess.Enqueue(ctx, key, fmt.Sprint(what, "-", i))
		if err != nil {
			t.Errorf("%s: Enqueue: %v", what, err)
			return checked
		}
		if _, err := raw.Sync(tk.Name); err != nil {
			t.Errorf("%s: sync: %v", what, err)
			return checked
		}
		_, st, err := raw.Exists(tk.Name)
		if err != nil || st == nil {
			t.Errorf("%s: Exists(%s) = %v, %v", what, tk.Name, st, err)
			return checked
		}
		if owner := b.Conn().SessionID(); uint64(st.Czxid) != tk.Token || st.EphemeralOwner != owner {
			t.Errorf("%s: %s token %d, owner %#x; the node's czxid is %d, owner %#x",
				what, tk.Name, tk.Token, owner, st.Czxid, st.EphemeralOwner)
		}
		checked++
		if err := sess.Dequeue(ctx, tk); err != nil {
			t.Errorf("%s: Dequeue: %v", what, err)
			return checked
		}
	}
	return checked
}
