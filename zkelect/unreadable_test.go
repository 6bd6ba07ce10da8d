package zkelect_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/zkelect"
)

// ZooKeeper's opcodes the tests look for: the requests a session sends
// on its own (its confirms are syncs), and a container's create.
const (
	opSync            = 9
	opPing            = 11
	opCreateContainer = 19
)

// opDialer dials as go-zookeeper would, and calls onWrite with the opcode
// of each request once it has been written (go-zookeeper writes one
// request per Write).
func opDialer(onWrite func(op int32)) zk.Dialer {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		return &opConn{Conn: c, onWrite: onWrite}, nil
	}
}

type opConn struct {
	net.Conn
	onWrite func(op int32)
}

func (c *opConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if len(b) >= 12 {
		c.onWrite(int32(binary.BigEndian.Uint32(b[8:12])))
	}
	return n, err
}

// mkKey creates key's node with acl, and its missing ancestors open.
func mkKey(t *testing.T, admin *zk.Conn, key string, acl []zk.ACL) {
	t.Helper()
	for i := 1; i < len(key); i++ {
		if key[i] != '/' {
			continue
		}
		if _, err := admin.Create(key[:i], nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatal(err)
		}
	}
	if _, err := admin.Create(key, nil, 0, acl); err != nil {
		t.Fatal(err)
	}
}

// TestWaitHead_PredecessorItCannotReadIsWaitedOnWithoutPolling: a
// predecessor whose ACL denies this client READ (another digest user's
// node; Curator with a creator-only ACLProvider) can be neither read nor
// watched: ZooKeeper answers NoAuth and sends no event of it to this
// client. The waiter used to read the queue and retry the watch every
// 50 ms for as long as the predecessor stayed (about 40 requests a
// second). It now watches the queue's children, and is elected when the
// predecessor goes.
func TestWaitHead_PredecessorItCannotReadIsWaitedOnWithoutPolling(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := secKey(t)
	admin := rawConn(t, "", "")
	mkKey(t, admin, key, zk.WorldACL(zk.PermAll))
	other := rawConn(t, "other", "other-secret")
	held, err := other.Create(key+"/_c_0f0e0d0c-0b0a-4908-8706-050403020100-lock-", []byte("curator"),
		zk.FlagEphemeral|zk.FlagSequence, zk.DigestACL(zk.PermAll, "other", "other-secret"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := admin.Get(held); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("reading the other user's node without its credentials: %v, want NoAuth", err)
	}

	var writes atomic.Int64
	// Requests counted, pings and confirms left out: those come every
	// third of the session timeout whatever the waiter does.
	b := dialWith(t, zkelect.WithDialer(opDialer(func(op int32) {
		if op != opPing && op != opSync {
			writes.Add(1)
		}
	})))
	e := newZKElector(t, b, key, "tenure")
	done := make(chan error, 1)
	go func() { _, err := e.Campaign(ctx); done <- err }()
	waitUntil(t, "tenure's node queued behind the other", func() bool {
		c, _, err := admin.Children(key)
		return err == nil && len(c) == 2
	})
	time.Sleep(200 * time.Millisecond) // past Campaign's first looks
	before := writes.Load()
	const hold = 1500 * time.Millisecond
	select {
	case err := <-done:
		t.Fatalf("Campaign returned while the other's node held the key: %v", err)
	case <-time.After(hold):
	}
	sent := writes.Load() - before
	if sent > 2 {
		t.Errorf("the waiter sent %d requests (pings and confirms left out) in %v while the predecessor it cannot read held the key, want at most 2", sent, hold)
	}
	deleted := time.Now()
	if err := other.Delete(held, -1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		t.Logf("elected %v after the unreadable predecessor was deleted; %d requests (pings and confirms left out) while it held", time.Since(deleted).Round(time.Millisecond), sent)
	case <-time.After(5 * time.Second):
		t.Fatal("not elected 5 s after the predecessor was deleted")
	}
}

// TestWaitHead_AQueueItMayNotReadIsAnInvalidConfig: a key whose ACL lets
// this client create and delete nodes under it but not read it: the queue
// read is refused, and Campaign fails with ErrInvalidConfig at once (it
// retried until its ctx ended) and leaves no node.
func TestWaitHead_AQueueItMayNotReadIsAnInvalidConfig(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := secKey(t)
	admin := rawConn(t, "owner", "owner-secret")
	mkKey(t, admin, key, append(zk.WorldACL(zk.PermCreate|zk.PermDelete), zk.DigestACL(zk.PermAll, "owner", "owner-secret")...))
	b := dialWith(t)
	e := newZKElector(t, b, key, "tenure")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := e.Campaign(cctx)
	if !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Campaign on a queue it may not read: %v after %v, want tenure.ErrInvalidConfig", err, time.Since(start).Round(time.Millisecond))
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Campaign took %v to fail", took)
	}
	waitUntil(t, "no node left under the key", func() bool {
		c, _, err := admin.Children(key)
		return err == nil && len(c) == 0
	})
}
