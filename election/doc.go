// Package election is tenure's backend-neutral core: the Elector that
// campaigns for a key, holds its term, demotes itself when it can no longer
// be sure it leads, and runs the program's callbacks in order; and the
// Mutex, a fair lock on the same machinery. Backends (etcdelect, zkelect,
// redislock, and the in-memory electiontest.Memory's Client) implement the
// small Backend interface; this package imports none of them.
//
// # Guarantees
//
//   - At most one leader per key at any instant, as far as the backend is
//     linearizable: the leader is the oldest live entry of the key's queue,
//     and ownership of that entry is re-read after every wait, before
//     Campaign returns.
//   - Terms only grow, on a linearizable backend (etcd, ZooKeeper; not
//     Redis, whose terms are advisory: see tenure.Term.Advisory). Every
//     term's Token is larger than every earlier leader's, so a resource that refuses tokens lower than the highest it
//     has seen cannot be written by a stale leader.
//   - The leader demotes itself before the server can elect another. Every
//     renewal the server acknowledges moves the lease deadline to send time
//     of that request + granted TTL − Config.DeadlineMargin, on the local
//     monotonic clock. When the deadline passes without a newer
//     acknowledgement, the leadership context is cancelled and the session
//     is abandoned (closed, its entries released, only DeadlineMargin later,
//     the earliest the server could expire it, and once Run's elected work
//     has returned). Since the server counts its TTL from when it received
//     the request, which is after it was sent, the local deadline always
//     falls at least DeadlineMargin before the server's expiry. (A backend
//     whose server may count from an earlier instant reports that instant
//     as the renewal's send time: zkelect, on a ZooKeeper ensemble.)
//   - A waiting Campaign never outlives its session: it returns an error
//     wrapping tenure.ErrSessionExpired as soon as the session dies, and it
//     removes its own entry on every error path.
//   - Leadership is never released (the entry deleted) while the elected
//     work still runs, unless the lease itself is gone.
//
// What it does not guarantee: that work ignoring its cancelled context stops
// in time. OnHardStop runs after Config.StopTimeout; fence the resource with
// the term's Token.
//
// # Failover bound
//
// When a leader crashes, its successor leads within
//
//	TTL + server expiry granularity + one watch delivery + one read
//
// of the crash (etcd checks lease expiry every 500 ms; a handoff after
// Resign costs one delete, one watch delivery and one read, a few
// milliseconds on a local server). A leader that is cut off demotes itself
// at most TTL − DeadlineMargin after its last acknowledged renewal was sent.
//
// # Usage
//
// Run is the loop most programs want:
//
//	e, err := election.New(backend, election.Config{Key: "report"})
//	if err != nil { ... }
//	defer e.Close(context.Background())
//	err = e.Run(ctx, tenure.Callbacks{
//		OnElected: func(ctx context.Context, t tenure.Term) { work(ctx, t.Token) },
//	})
//
// Campaign, TryCampaign and Resign give manual control; Done and Err report
// the loss of the term that Campaign returned.
package election
