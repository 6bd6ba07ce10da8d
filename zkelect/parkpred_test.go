package zkelect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/zkelect"
)

// TestWaitHead_GivingUpAgainAndAgainKeepsOneWatch: a candidate that gives
// up waiting behind the same holder again and again (Campaign with a
// 100 ms deadline, 20 times) keeps one watch on the holder's node, not one
// per try (go-zookeeper keeps every watch channel until the node changes),
// and is elected at once when the holder goes.
func TestWaitHead_GivingUpAgainAndAgainKeepsOneWatch(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := secKey(t)
	ba, bb := dialWith(t), dialWith(t)
	a, b := newZKElector(t, ba, key, "a"), newZKElector(t, bb, key, "b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const tries = 20
	for i := range tries {
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err := b.Campaign(cctx)
		cancel()
		if !errors.Is(err, tenure.ErrCanceled) {
			t.Fatalf("try %d behind a: %v, want ErrCanceled", i, err)
		}
	}
	if n := zkelect.WatchersOf(bb, ta.Entry); n > 2 {
		t.Errorf("b's connection keeps %d watches on a's node after %d tries behind it, want at most 2", n, tries)
	}
	done := make(chan error, 1)
	go func() { _, err := b.Campaign(ctx); done <- err }()
	time.Sleep(100 * time.Millisecond)
	resigned := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("b elected %v after a resigned", time.Since(resigned).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("b not elected 5 s after a resigned")
	}
	if n := zkelect.WatchersOf(bb, ta.Entry); n != 0 {
		t.Errorf("%d watches on a's deleted node remain", n)
	}
}
