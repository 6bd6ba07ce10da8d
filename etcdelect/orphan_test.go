package etcdelect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

// TestEnqueue_GivenUpUndeletableEntryEndsTheSession: a campaign given up
// while its put is in flight deletes the entry the put may have made. When
// that delete fails as well, the session must end, so that its lease (and
// the entry with it) goes: the entry's name is the session's, and a
// session kept alive would keep at the head of the queue an entry that no
// campaign knows of, for as long as the process runs.
//
// The put goes through a proxy that holds every byte for 1 s; the campaign
// gives up after 600 ms, while the put is on its way. As soon as the put
// lands, the service's role loses its write permission, so the clean-up
// delete, 600 ms behind the put, is refused; then the permission is back.
func TestEnqueue_GivenUpUndeletableEntryEndsTheSession(t *testing.T) {
	s := startSecureEtcd(t)
	p, err := faultproxy.New(s.endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cfg := s.config(t, "billing", billingPassword)
	cfg.Endpoints = []string{p.Addr()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := ctxT(t, 60*time.Second)
	const key = "billing/given-up"
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	// A first term opens the session that the next campaign reuses, so
	// that its first request is the put.
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}

	p.Delay(time.Second)
	cctx, giveUp := context.WithTimeout(ctx, 600*time.Millisecond)
	defer giveUp()
	done := make(chan error, 1)
	go func() {
		_, err := e.Campaign(cctx)
		done <- err
	}()
	waitFor(t, "the put to land", func() bool { return len(s.keys(t, key+"/")) == 1 })
	role, prefix := "tenure-billing", "billing/"
	if _, err := s.root.RoleRevokePermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, tenure.ErrCanceled) {
		t.Fatalf("Campaign given up = %v, want ErrCanceled", err)
	}
	if _, err := s.root.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	p.Delay(0)
	// Within a TTL: the ended session's lease is revoked at once when the
	// link allows, and expires a TTL after its last renewal otherwise.
	deadline := time.Now().Add(12 * time.Second)
	for len(s.keys(t, key+"/")) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the given-up campaign's entry %v still stands 12 s on: its session lives on", s.keys(t, key+"/"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
