package etcdelect_test

import (
	"testing"
	"time"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

// TestWaitHead_ASilentConnectionDoesNotStrandTheWaiter: a waiter's client
// (without keepalive pings) reaches etcd through two endpoints, and the
// connection its watches run on goes silent (no reset, no answer). etcd's
// client never finds such a connection dead, and a watch on its stream
// never delivers: the waiter was not elected 40 s after the holder
// resigned, before. Its reads are bounded and hedged now, and a renewal
// that goes unanswered for half its interval has it ask its watch's
// stream for a progress notice and, with none in time, wait again on a
// new stream.
func TestWaitHead_ASilentConnectionDoesNotStrandTheWaiter(t *testing.T) {
	ctx := ctxT(t, 90*time.Second)
	first, err := faultproxy.New(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := faultproxy.New(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	// The client has the first endpoint alone until the waiter has queued
	// and watches through it.
	cli := newClient(t, first.Addr())
	defer cli.Close()
	hcli := newClient(t, endpoint)
	defer hcli.Close()
	cfg := election.Config{Key: electiontest.Key(t), Identity: "holder", TTL: 6 * time.Second}
	h, err := election.New(etcdelect.New(hcli), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(ctx)
	if _, err := h.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Identity = "waiter"
	w, err := election.New(etcdelect.New(cli), cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.Campaign(ctx)
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, err := w.Position(ctx); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cli.SetEndpoints(first.Addr(), second.Addr())
	for second.Accepted() == 0 {
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatal("the client did not connect to the second endpoint")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the connection's handshake
	first.Blackhole()
	defer first.Heal()
	time.Sleep(time.Second)
	resigned := time.Now()
	if err := h.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the waiter's campaign: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the waiter was not elected 40 s after the holder resigned")
	}
	t.Logf("the waiter was elected %v after the holder resigned, its first connection silent since 1 s before", time.Since(resigned).Round(time.Millisecond))
	first.Heal()
	if err := w.Close(ctx); err != nil {
		t.Logf("Close: %v", err)
	}
}
