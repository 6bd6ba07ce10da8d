// Package etcdelect is tenure's etcd backend: an election.Backend on an etcd
// v3 client.
//
// # Guarantees
//
// etcd is linearizable, so the term's Token, the create revision of the
// leader's key, is a fencing token: every new leader of a key holds a larger
// one than every leader before it.
//
// # Recipe
//
// The key layout is that of go.etcd.io/etcd/client/v3/concurrency: a
// candidate's entry is "<key>/<lease ID in hex>", attached to its session's
// lease, holding its identity; the queue is ordered by create revision and
// its oldest entry leads. `etcdctl elect KEY` and `etcdctl lock KEY` (which
// are concurrency.Election and concurrency.Mutex) therefore contend on the
// same keys as tenure, in one fair queue.
//
// It differs from concurrency where that package is unsafe or slow:
//
//   - The session renews its lease itself, one KeepAliveOnce every
//     RenewInterval, and reports the send time of each acknowledged request,
//     which is what the elector's lease deadline needs.
//   - A waiter watches only its predecessor, and creates that watch from
//     the current revision, then re-reads the predecessor if anything was
//     written since it read the queue. A watch that
//     starts at a past revision is "unsynced" in etcd's watchable store and
//     is served by a loop that runs every 100 ms, which is where raw
//     concurrency.Election's ~100 ms handoffs come from.
//   - A waiter also watches its own key, so a session that expires or is
//     revoked while waiting ends the campaign at once (etcd-io/etcd#19597).
//   - Ownership is re-read after every wait: the campaign returns only after
//     a read that shows its own key, with its create revision, and no older
//     key.
//   - Watches require a leader (clientv3.WithRequireLeader), so a member
//     cut off from its cluster fails them instead of going silent.
//   - On queues of 32 keys or more, a holder that resigns records the
//     handover ("<key>.tenure-released", outside the queue's prefix, on its
//     lease) in its delete's transaction, and the next waiter proves itself
//     first from that record instead of a range over the whole queue
//     (docs/etcd.md).
//
// # Security
//
// Security fills in a clientv3.Config with TLS and a user; the role a
// service's user needs is readwrite on its keys' prefix (docs/security.md).
// A request the server refuses for its credentials is
// tenure.ErrInvalidConfig and is not retried. Keys under "<key>/" that are
// not entries (another client's data) are not contenders.
//
// The Backend does not own the client: close it after every Elector that
// uses it.
package etcdelect
