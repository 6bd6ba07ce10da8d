package etcdelect_test

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

// TestRenewal_AHeldKeepAliveDoesNotDemote: the leader's client reaches
// etcd over two connections, and one of them starts holding every request
// (a member partitioned from its peers, still reachable, holds lease
// renewals while it waits for a raft leader). The client's balancer sends
// every other renewal there. At Validate's limit (TTL 3 s, RenewInterval
// 1 s, DeadlineMargin 1 s) a held renewal used to take the whole interval
// and its retry came after the deadline: the leader demoted. Now a second
// request goes out on the other connection at half the interval.
func TestRenewal_AHeldKeepAliveDoesNotDemote(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	var eps []string
	var held *faultproxy.Proxy
	for i := range 2 {
		p, err := faultproxy.New(endpoint)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if i == 0 {
			held = p
		}
		eps = append(eps, p.Addr())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := election.New(etcdelect.New(cli), election.Config{
		Key: electiontest.Key(t), Identity: "a", TTL: 3 * time.Second, RenewInterval: time.Second, DeadlineMargin: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held.Blackhole()
	since := time.Now()
	const watch = 12 * time.Second
	select {
	case <-e.Done():
		t.Fatalf("demoted %v after one of its two connections began to hold requests: %v", time.Since(since).Round(time.Millisecond), e.Err())
	case <-time.After(watch):
	}
	if !e.IsLeader() {
		t.Fatalf("term %d not held %v after one connection began to hold requests", term.Token, watch)
	}
	// Heal cuts the held connection's requests; the resign may ride on it.
	held.Heal()
	if err := e.Close(ctx); err != nil {
		t.Logf("Close after the heal: %v", err)
	}
}
