// Package fence holds the checks that make a fencing token worth having:
// the protected resource remembers the highest term it has accepted and
// refuses writes carrying a lower one.
//
// # Guarantees
//
// A lock cannot stop a holder that paused (a GC pause, SIGSTOP, a slow disk)
// past its lease and woke up still believing it holds: by then another
// holder has a larger token. Only the resource can refuse the stale
// holder's write, and only if every write carries the token and the check
// and the write are atomic. Each verifier here is atomic with the write it
// guards:
//
//   - Guard: in-process, for a resource that is one process (a service
//     taking orders from a leader; see Middleware for HTTP). Guard.Do and
//     Middleware run the write under the resource's lock; Guard.Check
//     only admits, and is not atomic with a write made after it. It
//     remembers in memory only: a restarted process accepts any term once.
//   - pgfence: PostgreSQL; the fence row is updated in the same transaction
//     as the write, at READ COMMITTED.
//   - etcdfence: an etcd Txn that commits only while the holder's key still
//     has its create revision.
//   - zkfence: a ZooKeeper Multi that commits only while the holder's node
//     still exists.
//
// What fencing does not do: make a non-idempotent side effect outside the
// resource safe (an e-mail already sent stays sent), or help when the token
// comes from a backend that is not linearizable (a Redis INCR counter can
// go back after a failover).
package fence
