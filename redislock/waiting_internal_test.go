package redislock

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenure-go/tenure/internal/redisserver"
)

// TestStillWaiting_RenewedTwiceInOneMillisecond: a waiting entry renewed
// again within the millisecond of its last renewal (or of the try that
// registered it) gets the same score, and ZADD XX CH counts no change: it
// read as lapsed, and the waiter stopped renewing and tried again for
// nothing. Renewals back to back, many of them in one millisecond, must all
// find the entry.
func TestStillWaiting_RenewedTwiceInOneMillisecond(t *testing.T) {
	srv, err := redisserver.Start(t.TempDir(), redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const set, member, ttlMs = "k:waiting", "session random", "3000"
	if err := c.ZAdd(ctx, set, redis.Z{Score: 1, Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	lapsed := 0
	for range 300 {
		n, err := stillWaitingScript.Run(ctx, c, []string{set}, member, ttlMs).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			lapsed++
		}
	}
	if lapsed > 0 {
		t.Fatalf("%d of 300 renewals of a registered waiting entry said it had lapsed", lapsed)
	}
	if n, err := stillWaitingScript.Run(ctx, c, []string{set}, "someone else", ttlMs).Int64(); err != nil || n != 0 {
		t.Fatalf("renewal of an entry that is not registered: %d, %v; want 0 (lapsed)", n, err)
	}
}

// TestNew_KeepsItsOwnListOfMasters: a caller that reuses its slice after
// New does not change the Backend's masters (a master counted twice would
// vote twice in Redlock).
func TestNew_KeepsItsOwnListOfMasters(t *testing.T) {
	cs := []*redis.Client{
		redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}),
		redis.NewClient(&redis.Options{Addr: "127.0.0.1:2"}),
		redis.NewClient(&redis.Options{Addr: "127.0.0.1:3"}),
	}
	orig := slices.Clone(cs)
	defer func() {
		for _, c := range orig {
			c.Close()
		}
	}()
	b, err := New(cs, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cs[1] = cs[0]
	if b.masters[1] != orig[1] {
		t.Fatalf("the Backend's master 1 changed with the caller's slice")
	}
}
