package zkelect_test

import (
	"context"
	"errors"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/zkelect"
)

// TestEnqueue_GivenUpWhileTheLinkIsDownLeavesNoNode: a campaign given up
// (its ctx ended: the caller's, or the lease deadline while cut off) after
// its create reached the server but before the reply came back, while the
// link is down, must not leave its node behind. The ZooKeeper session
// outlives the outage, so such a node would stay at the head of the queue,
// owned by a live session no campaign knows of, and block every candidate,
// this session's next campaign included, for as long as the process runs.
// TestEnsemble_LeaderServerKilled once stalled this way.
func TestEnqueue_GivenUpWhileTheLinkIsDownLeavesNoNode(t *testing.T) {
	for _, cut := range []struct {
		name  string
		after time.Duration // from the node's creation to the cut
		// blackhole: the link drops every byte until the client gives
		// up on it, instead of being cut and reconnected at once, so
		// that the reads Enqueue makes after giving up fail too.
		blackhole bool
	}{
		{"create reply lost", 0, false},
		{"read after the create lost", 750 * time.Millisecond, true},
	} {
		t.Run(cut.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, b, sess := sessionBehindProxy(t, ctx)
			id := b.Conn().SessionID()
			admin := rawConn(t, "", "")
			key := electiontest.Key(t)

			// Every byte now waits 500 ms each way: the create reaches the
			// server 500 ms on, its reply comes back 500 ms later, and the
			// reads that follow it reach the server 500 ms after that and
			// come back at 1.5 s from the node's creation. Each cut lands
			// with at least 500 ms to spare.
			p.Delay(500 * time.Millisecond)
			ectx, giveUp := context.WithCancel(ctx)
			defer giveUp()
			done := enqueue(ectx, sess, key)
			var node string
			waitUntil(t, "the node created", func() bool {
				c, _, err := admin.Children(key)
				if err == nil && len(c) == 1 {
					node = path.Join(key, c[0])
				}
				return node != ""
			})
			time.Sleep(cut.after)
			if cut.blackhole {
				p.Blackhole()
				giveUp()
				if r := <-done; r.err == nil {
					t.Fatal("Enqueue succeeded after its ctx ended with the reply lost")
				}
				// go-zookeeper gives the link up after 2/3 of the session
				// timeout; heal it then, well before the server would
				// expire the session.
				waitUntil(t, "the client to give the link up", func() bool {
					return b.Conn().State() != zk.StateHasSession
				})
				p.Delay(0)
				p.Heal()
			} else {
				giveUp()
				p.Delay(0)
				p.Cut() // the reply in flight is lost; the client reconnects
				if r := <-done; r.err == nil {
					t.Fatal("Enqueue succeeded after its ctx ended with the reply lost")
				}
			}

			waitUntil(t, "the connection back on the same session", func() bool {
				ok, _, err := b.Conn().Exists("/")
				return err == nil && ok
			})
			if got := b.Conn().SessionID(); got != id {
				t.Fatalf("session %#x replaced by %#x: the node went with it, and this test shows nothing", id, got)
			}
			waitUntil(t, "the given-up node deleted", func() bool {
				ok, st, err := admin.Exists(node)
				return err == nil && (!ok || st.EphemeralOwner != id)
			})
		})
	}
}

// TestEnqueue_AgainAfterAFailedReadKeepsTheNode: Enqueue on a key where the
// session already has a node (an earlier campaign's delete failed) returns
// that node. When that Enqueue fails partway (its ctx ends while the link
// is slow), the node must stay known to the session: forgetting it while
// it exists would make the next Enqueue queue a second node behind it.
func TestEnqueue_AgainAfterAFailedReadKeepsTheNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, _, sess := sessionBehindProxy(t, ctx)
	admin := rawConn(t, "", "")
	key := electiontest.Key(t)
	first, err := sess.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	// Each request now takes 600 ms: the Enqueue below is given up during
	// its read of the queue. (Before the fix, it made a second read, of
	// the node's data, after which it forgot the node; it reads once now.)
	giveUpAfter := 300 * time.Millisecond
	p.Delay(300 * time.Millisecond)
	ectx, ecancel := context.WithTimeout(ctx, giveUpAfter)
	_, err = sess.Enqueue(ectx, key, "a")
	ecancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the Enqueue given %v on a link that takes 600 ms: %v, want it given up (context.DeadlineExceeded)", giveUpAfter, err)
	}
	p.Delay(0)
	time.Sleep(time.Second) // what was in flight arrives
	again, err := sess.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	if again.Name != first.Name || again.Token != first.Token {
		t.Fatalf("given up after %v, then Enqueue again: node %s (czxid %d), want the session's node %s (czxid %d)", giveUpAfter, again.Name, again.Token, first.Name, first.Token)
	}
	waitUntil(t, "one node in the queue", func() bool {
		c, _, err := admin.Children(key)
		return err == nil && len(c) == 1
	})
}

// sessionBehindProxy opens a Backend (8 s session timeout) whose link goes
// through a fault proxy, and a session on it; all three end with the test.
func sessionBehindProxy(t *testing.T, ctx context.Context) (*faultproxy.Proxy, *zkelect.Backend, election.Session) {
	t.Helper()
	p, err := faultproxy.New(server.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	b, sess := openSession(t, ctx, []string{p.Addr()}, 8*time.Second)
	return p, b, sess
}

// enqueued is what an Enqueue run by enqueue returned.
type enqueued struct {
	t   election.Ticket
	err error
}

// enqueue runs sess.Enqueue(ctx, key, "a") in the background; what it
// returns arrives on the channel.
func enqueue(ctx context.Context, sess election.Session, key string) <-chan enqueued {
	ch := make(chan enqueued, 1)
	go func() {
		t, err := sess.Enqueue(ctx, key, "a")
		ch <- enqueued{t, err}
	}()
	return ch
}

// openSession dials servers with session timeout d and opens a session on
// the Backend; both end with the test, before what the test's earlier
// Cleanups end.
func openSession(t *testing.T, ctx context.Context, servers []string, d time.Duration, opts ...zkelect.Option) (*zkelect.Backend, election.Session) {
	t.Helper()
	b, err := zkelect.Dial(ctx, servers, d, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	sess, err := b.OpenSession(ctx, election.SessionOptions{TTL: d, RenewInterval: d / 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close(context.Background()) })
	return b, sess
}

// TestEnqueue_CreateQueuedAcrossAnExpiryLeavesNoNode: go-zookeeper keeps a
// request made while it has no connection and sends it on the next one,
// whatever session that carries. A campaign that starts while its session
// is expiring unseen (the server deleted the leader's node, which ends the
// term, and the client has not yet learned why) thus creates its node under
// the connection's next session. Whether Enqueue then sees that the node
// is not its session's, or has given up already (the session's end ended
// its ctx), the node must go: it is owned by a live session that no
// campaign knows of, and once it reached the head it would block the queue
// for as long as the process runs. The chaos suite's expire scenario
// stalled this way (1 fault in 1,580 at one run, 5 in 920 at another).
func TestEnqueue_CreateQueuedAcrossAnExpiryLeavesNoNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		giveUp bool // the campaign's ctx ends while its create waits
	}{
		{"the create's reply seen", false},
		{"the create given up", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			// Four routes to the one server. go-zookeeper fails a waiting
			// request (ErrNoServer) only when it comes back to the route it
			// last had a session on; after the cut it tries the next route
			// (and hangs there), after the heal the next one (which says
			// the session expired), then the next one, which opens the new
			// session and sends the create.
			var eps []string
			var ps []*faultproxy.Proxy
			for range 4 {
				p, err := faultproxy.New(server.Endpoints()[0])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				ps, eps = append(ps, p), append(eps, p.Addr())
			}
			b, sess := openSession(t, ctx, eps, ttl)
			admin := rawConn(t, "", "")
			key := electiontest.Key(t)
			// A node of the session's, to see the server expire it.
			probe, err := sess.Enqueue(ctx, key+"-probe", "probe")
			if err != nil {
				t.Fatal(err)
			}
			// The queue's node exists already: the create is the
			// campaign's first request.
			if _, err := admin.Create(key, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
				t.Fatal(err)
			}
			old := b.Conn().SessionID()

			for _, p := range ps {
				p.Blackhole()
			}
			waitUntil(t, "the client to give the link up", func() bool {
				return b.Conn().State() != zk.StateHasSession
			})
			// The client does not know yet that its session is expiring:
			// the campaign goes ahead, and its create waits for a
			// connection.
			ectx, giveUp := context.WithCancel(ctx)
			defer giveUp()
			done := enqueue(ectx, sess, key)
			waitUntil(t, "the server to expire the session", func() bool {
				ok, _, err := admin.Exists(probe.Name)
				return err == nil && !ok
			})
			want := tenure.ErrSessionExpired
			if tc.giveUp {
				giveUp()
				want = context.Canceled
				if r := <-done; !errors.Is(r.err, want) {
					t.Fatalf("Enqueue given up: %v, want %v", r.err, want)
				}
			}
			for _, p := range ps {
				p.Heal()
			}
			if !tc.giveUp {
				if r := <-done; !errors.Is(r.err, want) {
					t.Fatalf("Enqueue across the expiry: %v, want %v", r.err, want)
				}
			}
			waitUntil(t, "a new session", func() bool {
				id := b.Conn().SessionID()
				return id != 0 && id != old
			})
			// The create has been sent on the new session once a read
			// sent after it is answered.
			if _, _, err := b.Conn().Exists("/"); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "no node left under the key", func() bool {
				c, _, err := admin.Children(key)
				return err == nil && len(c) == 0
			})
		})
	}
}

// TestEnqueue_AfterALostReplyItsGUIDGoesWithTheNode: a create whose reply
// was lost may commit after the lookup that followed it found nothing (the
// connection moved to a server that had not applied it yet), so Enqueue
// creates again and gets a second node of the same guid. WaitHead deletes
// the first when it sees it ahead; a campaign that ends before (TryCampaign
// finding the key held, a cancelled ctx) must not leave it, owned by the
// live session, at the head of the queue. One server cannot lag behind
// itself, so the test makes the late node with its admin connection.
func TestEnqueue_AfterALostReplyItsGUIDGoesWithTheNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cutOff: the session is closed while the link is down, so its
		// delete fails and goes to the background.
		cutOff bool
	}{
		{"dequeued", false},
		{"closed while cut off", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, _, sess := sessionBehindProxy(t, ctx)
			admin := rawConn(t, "", "")
			key := electiontest.Key(t)

			// The create reaches the server 500 ms after it is sent; its
			// reply is cut on the way back, and Enqueue finds the node by
			// its guid.
			p.Delay(500 * time.Millisecond)
			done := enqueue(ctx, sess, key)
			waitUntil(t, "the node created", func() bool {
				c, _, err := admin.Children(key)
				return err == nil && len(c) == 1
			})
			p.Delay(0)
			p.Cut()
			r := <-done
			if r.err != nil {
				t.Fatalf("Enqueue with its create's reply lost: %v", r.err)
			}
			tk := r.t
			base := path.Base(tk.Name)
			prefix := base[:strings.LastIndex(base, "-lock-")+len("-lock-")]
			late, err := admin.Create(path.Join(key, prefix), []byte("a"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
			if err != nil {
				t.Fatal(err)
			}
			if tc.cutOff {
				p.Blackhole()
				cctx, ccancel := context.WithTimeout(ctx, 300*time.Millisecond)
				err := sess.Close(cctx)
				ccancel()
				if err == nil {
					t.Fatal("Close with the link down succeeded: the test shows nothing")
				}
				p.Heal()
			} else if err := sess.Dequeue(ctx, tk); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the late node of the same guid deleted", func() bool {
				ok, _, err := admin.Exists(late)
				return err == nil && !ok
			})
		})
	}
}

// TestEnqueue_FailedOnANewKeyLeavesNoKey: an Enqueue that creates a new
// key (a container) and then cannot queue under it deletes the key again.
// ZooKeeper deletes a container only once it has had a child, so before,
// the key (and every ancestor above it) stayed for good. The queue create
// fails here because the ACL the Backend gives its nodes lacks create.
func TestEnqueue_FailedOnANewKeyLeavesNoKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	noCreate := zk.WorldACL(zk.PermRead | zk.PermWrite | zk.PermDelete | zk.PermAdmin)
	b, err := zkelect.Dial(ctx, server.Endpoints(), ttl, zkelect.WithACL(noCreate))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	key := "/" + strings.ReplaceAll(electiontest.Key(t)[1:], "/", "-") // directly under the root, which lets anyone create
	if _, err := s.Enqueue(ctx, key, "a"); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Enqueue under a key whose ACL refuses create: %v, want ErrInvalidConfig", err)
	}
	admin, _, err := zk.Connect(server.Endpoints(), ttl, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, _, err := admin.Exists(key)
		if err == nil && !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s still there 5 s after the failed Enqueue (exists %v, %v)", key, ok, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEnqueue_NodeDeletedAsItIsCreatedKeepsTheSession: another client
// deletes the node between its create and Enqueue's read of it (the tap
// off, so Enqueue reads every node back). The session is alive: Enqueue
// fails with ErrOwnershipLost and the session stays usable. Before, the
// session was ended as expired (ErrSessionExpired, its expiry counted)
// while its ZooKeeper session lived.
func TestEnqueue_NodeDeletedAsItIsCreatedKeepsTheSession(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, b, sess := sessionBehindProxy(t, ctx)
	zkelect.DisableTap(b)
	admin := rawConn(t, "", "")
	key := electiontest.Key(t)
	// Make the key first: the delete below must race only the read back.
	if r := <-enqueue(ctx, sess, key); r.err != nil {
		t.Fatal(r.err)
	} else if err := sess.Dequeue(ctx, r.t); err != nil {
		t.Fatal(err)
	}
	p.Delay(300 * time.Millisecond)
	done := enqueue(ctx, sess, key)
	waitUntil(t, "the node created, then deleted by another client", func() bool {
		c, _, err := admin.Children(key)
		if err != nil || len(c) != 1 {
			return false
		}
		return admin.Delete(path.Join(key, c[0]), -1) == nil
	})
	r := <-done
	p.Delay(0)
	if !errors.Is(r.err, tenure.ErrOwnershipLost) || errors.Is(r.err, tenure.ErrSessionExpired) {
		t.Fatalf("Enqueue whose node another client deleted before it read it: %v, want ErrOwnershipLost", r.err)
	}
	if err := sess.Err(); err != nil {
		t.Fatalf("the session ended (%v) while its ZooKeeper session lives", err)
	}
	again := <-enqueue(ctx, sess, key)
	if again.err != nil {
		t.Fatalf("Enqueue again on the same session: %v", again.err)
	}
}
