package zkelect_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/zkelect"
)

// TestEnqueue_KeyCreateGivenUpInFlightLeavesNoKey: an Enqueue whose ctx
// ends while its create of the key's node is in flight leaves no key
// behind once that create lands. ZooKeeper never deletes a container that
// never had a child, so the key used to stay for good.
func TestEnqueue_KeyCreateGivenUpInFlightLeavesNoKey(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	p, err := faultproxy.New(server.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := zkelect.Dial(dctx, []string{p.Addr()}, ttl)
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
	key := fmt.Sprintf("/unused-key-%d", time.Now().UnixNano())
	admin := rawConn(t, "", "")

	// A round trip takes 300 ms: the node's create answers NoNode at about
	// 300 ms, the key's create leaves then and is answered at about 600.
	p.Delay(150 * time.Millisecond)
	ectx, cancel := context.WithTimeout(ctx, 450*time.Millisecond)
	_, err = sess.Enqueue(ectx, key, "a")
	cancel()
	if err == nil {
		t.Fatal("Enqueue succeeded in 450 ms over 300 ms round trips")
	}
	p.Delay(0)
	made := false
	waitUntil(t, "the abandoned create of the key to land and the key to go", func() bool {
		ok, _, err := admin.Exists(key)
		made = made || ok
		return err == nil && !ok && made
	})
	if c, _, err := admin.Children(key); err != zk.ErrNoNode {
		t.Fatalf("key %s: children %v, %v; want no node", key, c, err)
	}
}
