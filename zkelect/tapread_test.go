package zkelect_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/zkelect"
)

// countingConn counts the reads go-zookeeper's connection makes of the
// socket, below the tap.
type countingConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(b)
}

// TestTap_OneReadPerReply: go-zookeeper reads every frame in two calls (its
// length, then its payload); the tap's buffer serves both from one read of
// the socket. 200 sequential requests, each answered by one frame, must
// take well under two reads each (a bare connection takes two, or more when
// a frame arrives in pieces); a reply may share its read with a frame of
// the connection's own (a ping's reply), so a few fewer than one each is
// fine.
func TestTap_OneReadPerReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var reads atomic.Int64
	b, err := zkelect.Dial(ctx, server.Endpoints(), ttl, zkelect.WithDialer(func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &reads}, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	key := electiontest.Key(t)
	conn := b.Conn()
	const n = 200
	before := reads.Load()
	for range n {
		if _, _, err := conn.Exists(key); err != nil {
			t.Fatal(err)
		}
	}
	got := reads.Load() - before
	t.Logf("%d reads of the socket for %d replies", got, n)
	if got > n*5/4 {
		t.Fatalf("%d reads of the socket for %d replies: the tap does not buffer them", got, n)
	}
	// Each reply is awaited before the next request, so only a frame of
	// the connection's own (a ping's reply, the role read Dial starts) can
	// share a read with one: the count cannot fall far below one per reply
	// unless reads go uncounted.
	if got < n*3/4 {
		t.Fatalf("%d reads of the socket for %d replies, each awaited before the next request: the count misses reads", got, n)
	}
}
