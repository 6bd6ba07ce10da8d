// Package etcdfence fences writes to etcd: a transaction that commits only
// while the holder's key still exists with its create revision and is
// still attached to the lease its name gives, that is, while the holder
// still holds (no older key can appear, so such a key is still the oldest
// entry).
package etcdfence

import (
	"context"
	"fmt"
	"math"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/fence"
)

// Fence guards etcd writes. It is a plain value, safe for concurrent use
// (a *clientv3.Client is).
type Fence struct {
	// Client is the etcd client the writes go through. Required: there is
	// no default.
	Client *clientv3.Client
	// Metrics, when set, counts refusals (verifier "etcd"). Default: nil,
	// counts nothing.
	Metrics *fence.Metrics
}

// Txn commits ops atomically if term's entry still has term's create
// revision and is still attached to the lease its name gives, and returns
// a *fence.StaleError otherwise. (An entry someone put again without its
// lease keeps its create revision, but is no contender any more: the
// backend demotes its holder and the next candidate leads.) term must come
// from an etcd election (Term.Backend "etcd", Term.Entry a key
// "<Term.Key>/<lease ID in hex>", Term.Token at most math.MaxInt64); any
// other term, an advisory Redis term
// included, is refused with an error wrapping tenure.ErrInvalidConfig.
//
// Without a put or a delete among ops (a check, or reads fenced by the
// term), the transaction also reads term.Entry, keys only, after ops (its
// response comes last): etcd answers a transaction of serializable reads
// alone, or of nothing, from the member the client talks to, which may be
// cut off from the others and not know that the term has ended; with a
// linearizable read in it, the member first agrees with the cluster.
func (f Fence) Txn(ctx context.Context, term tenure.Term, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if f.Client == nil {
		return nil, fmt.Errorf("%w: etcdfence: no Client", tenure.ErrInvalidConfig)
	}
	lease, ok := etcdelect.EntryLease(term.Key, term.Entry)
	if !ok || term.Token == 0 || term.Token > math.MaxInt64 || term.Backend != "etcd" {
		return nil, fmt.Errorf("%w: etcdfence: term %v is not an etcd holder's", tenure.ErrInvalidConfig, term)
	}
	writes := false
	for _, op := range ops {
		writes = writes || op.IsPut() || op.IsDelete()
	}
	if !writes {
		ops = append(ops[:len(ops):len(ops)], clientv3.OpGet(term.Entry, clientv3.WithKeysOnly()))
	}
	resp, err := f.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(term.Entry), "=", int64(term.Token)),
			clientv3.Compare(clientv3.LeaseValue(term.Entry), "=", lease)).
		Then(ops...).
		Commit()
	if err != nil {
		return nil, err
	}
	if !resp.Succeeded {
		f.Metrics.Rejected(term.Key, "etcd")
		return resp, &fence.StaleError{Resource: term.Key, Token: term.Token}
	}
	return resp, nil
}
