package etcdfence_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/fence"
	"github.com/tenure-go/tenure/fence/etcdfence"
	"github.com/tenure-go/tenure/internal/etcdembed"
)

var endpoint string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tenure-etcdfence-")
	if err != nil {
		panic(err)
	}
	srv, err := etcdembed.Start(dir)
	if err != nil {
		panic(err)
	}
	endpoint = srv.Endpoint
	code := m.Run()
	srv.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestTxn_EntryPutAgainWithoutItsLeaseIsStale: a holder's entry that
// someone puts again without its lease (etcdctl put) keeps its create
// revision, but it is no contender any more: the backend ends the holder's
// term and the next candidate leads. The fence must refuse the old
// holder's writes from then on, as it does once the entry is gone.
func TestTxn_EntryPutAgainWithoutItsLeaseIsStale(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	e, err := election.New(etcdelect.New(cli), election.Config{Key: "fenced", Identity: "a", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := etcdfence.Fence{Client: cli}
	if _, err := f.Txn(ctx, term, clientv3.OpPut("fenced-data", "1")); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if _, err := cli.Put(ctx, term.Entry, "taken over by hand"); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Get(ctx, term.Entry)
	if err != nil || len(g.Kvs) != 1 || uint64(g.Kvs[0].CreateRevision) != term.Token || g.Kvs[0].Lease != 0 {
		t.Fatalf("after the put: %v, %v; want the entry with its create revision %d and no lease", g, err, term.Token)
	}
	var stale *fence.StaleError
	if _, err := f.Txn(ctx, term, clientv3.OpPut("fenced-data", "2")); !errors.As(err, &stale) {
		t.Fatalf("write of the holder whose entry lost its lease = %v, want a StaleError", err)
	}
	if v, err := cli.Get(ctx, "fenced-data"); err != nil || len(v.Kvs) != 1 || string(v.Kvs[0].Value) != "1" {
		t.Fatalf("fenced-data = %v, %v; want the first write only", v, err)
	}
	// A term whose entry name gives no lease is no etcd holder's.
	bad := term
	bad.Entry = "fenced/not-a-lease"
	if _, err := f.Txn(ctx, bad, clientv3.OpPut("fenced-data", "3")); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("term with entry %q = %v, want ErrInvalidConfig", bad.Entry, err)
	}
	// A token no etcd revision can be: refused as bad input, not counted
	// as a stale write (before, it wrapped to a negative revision and was
	// refused as stale).
	huge := term
	huge.Token = math.MaxInt64 + 1
	if _, err := f.Txn(ctx, huge, clientv3.OpPut("fenced-data", "4")); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("term with token %d = %v, want ErrInvalidConfig", huge.Token, err)
	}
}

// TestTxn_NoClientIsAConfigError: a Fence without a Client refuses, with
// ErrInvalidConfig, instead of a nil pointer panic.
func TestTxn_NoClientIsAConfigError(t *testing.T) {
	term := tenure.Term{Key: "k", Entry: "k/1a", Token: 5, Backend: "etcd"}
	if _, err := (etcdfence.Fence{}).Txn(context.Background(), term); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Txn without a Client = %v, want ErrInvalidConfig", err)
	}
}

// TestTxn_ReadOnlyIsNotAnsweredByAMemberAlone: a fenced transaction
// without writes (a check, or reads fenced by the term) must not succeed
// on the word of one member that has lost the rest of its cluster: that
// member cannot know whether the term has ended (its lease expired, its
// entry deleted, on the majority side). etcd answers a transaction of
// serializable reads, or of nothing, from the member alone.
func TestTxn_ReadOnlyIsNotAnsweredByAMemberAlone(t *testing.T) {
	c, err := etcdembed.StartCluster(t.TempDir(), 3, 50, 500)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The client knows only member 2, the one left alone below.
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints()[2:3], DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// A holder's entry as etcdelect makes it: "<key>/<lease hex>" on its lease.
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	key := "fence-alone"
	entry := fmt.Sprintf("%s/%x", key, int64(lease.ID))
	put, err := cli.Put(ctx, entry, "holder", clientv3.WithLease(lease.ID))
	if err != nil {
		t.Fatal(err)
	}
	term := tenure.Term{Key: key, Entry: entry, Token: uint64(put.Header.Revision), Backend: "etcd", Identity: "holder"}
	f := etcdfence.Fence{Client: cli}
	if _, err := f.Txn(ctx, term); err != nil {
		t.Fatalf("with the whole cluster up: %v", err)
	}
	for _, i := range []int{0, 1} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	for name, ops := range map[string][]clientv3.Op{
		"no ops":              nil,
		"a serializable read": {clientv3.OpGet(key+"/data", clientv3.WithSerializable())},
	} {
		tctx, tcancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err := f.Txn(tctx, term, ops...)
		tcancel()
		if err == nil {
			t.Errorf("%s: the fenced transaction succeeded (revision %d) on a member cut off from its cluster's majority", name, resp.Header.Revision)
		}
	}
}
