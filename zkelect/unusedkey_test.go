package zkelect_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/zkelect"
)

// TestEnqueue_KeyCreateGivenUpInFlightLeavesNoKey: an Enqueue whose ctx
// ends while its create of the key's node, or of one of its ancestors, is
// in flight leaves no such node behind once that create lands. ZooKeeper
// never deletes a container that never had a child, so it used to stay
// for good (and its ancestors with it).
func TestEnqueue_KeyCreateGivenUpInFlightLeavesNoKey(t *testing.T) {
	for _, c := range []struct {
		name string
		key  func(base string) string // under base, which does not exist
	}{
		{"key", func(base string) string { return base }},
		{"ancestor", func(base string) string { return base + "/leader" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := fmt.Sprintf("/unused-%s-%d", c.name, time.Now().UnixNano())
			givenUpInFlight(t, c.key(base), base)
		})
	}
}

// givenUpInFlight runs an Enqueue on key that gives up as soon as its first
// container create (of first, the key or its top ancestor) is written, and
// checks that first is created, then deleted.
func givenUpInFlight(t *testing.T, key, first string) {
	ctx := ctxT(t, 60*time.Second)
	p, err := faultproxy.New(server.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var giveUp atomic.Pointer[context.CancelFunc]
	dialer := opDialer(func(op int32) {
		if f := giveUp.Load(); f != nil && op == opCreateContainer {
			(*f)() // the create is on its way: give up
		}
	})
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := zkelect.Dial(dctx, []string{p.Addr()}, ttl, zkelect.WithDialer(dialer))
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	sess, err := b.OpenSession(ctx, election.SessionOptions{TTL: ttl, RenewInterval: ttl / 3})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close(ctx)
	admin := rawConn(t, "", "")
	there, _, created, err := admin.ExistsW(first)
	if err != nil || there {
		t.Fatalf("ExistsW(%s): %v, %v", first, there, err)
	}

	// The create is held 200 ms each way by the proxy: the Enqueue gives
	// up as soon as it has been written, and it lands after.
	p.Delay(200 * time.Millisecond)
	ectx, cancelEnqueue := context.WithCancel(ctx)
	giveUp.Store(&cancelEnqueue)
	_, err = sess.Enqueue(ectx, key, "a")
	cancelEnqueue()
	if err == nil {
		t.Fatal("Enqueue succeeded although it gave up once its first create of the path was written")
	}
	select {
	case ev := <-created:
		if ev.Type != zk.EventNodeCreated {
			t.Fatalf("the watch on %s: %+v, want its creation", first, ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the create of %s, written before Enqueue gave up, never landed", first)
	}
	p.Delay(0)
	waitUntil(t, "the abandoned "+first+" to go", func() bool {
		ok, _, err := admin.Exists(first)
		return err == nil && !ok
	})
}
