// Package zkelect is tenure's ZooKeeper backend: an election.Backend on
// github.com/go-zookeeper/zk, with the ephemeral-sequential recipe that
// Curator's InterProcessMutex and kazoo's Lock use, so that Go, Java and
// Python processes can share one lock path.
//
// # Guarantees
//
// ZooKeeper orders writes through one leader, so the term's Token, the czxid
// (creation zxid) of the leader's node, is a fencing token: every new leader
// of a key holds a larger one than every leader before it.
//
// # Recipe
//
//   - Each candidate creates an ephemeral-sequential child of the key's
//     node, named "_c_<uuid>-lock-<10-digit sequence>" (Curator's protected
//     form) with its identity as data. The key's node and its ancestors are
//     created as container nodes when missing, so the server removes them
//     once empty.
//   - Contenders are all children whose names end in a 10-digit sequence,
//     ordered by that sequence, whatever their prefix (tenure's, Curator's
//     "_c_…-lock-", kazoo's "…__lock__" or "-lock-"). The lowest leads.
//   - The token is read off the create's reply: its zxid is the node's czxid
//     (go-zookeeper keeps it to itself; a wrapper around each connection it
//     dials reads it, and the session the reply came on, without changing a
//     byte). Only when that record is missing is the node read back.
//   - Each waiter watches only its predecessor (no herd effect); before a
//     waiter is told it leads, a queue read made after its predecessor went
//     must show its own node first while the connection still runs the
//     session that created it: a node name (uuid and sequence) is never
//     reused and an ephemeral node outlives no session, so its ephemeralOwner
//     is the current session (apache/curator CURATOR-696 gave two leaders
//     without such a check). A waiter does not watch its own node: a waiter
//     whose node was deleted learns it at its next wake-up.
//   - A candidate that queues again knows its predecessor without reading
//     the queue when its session's last read of it proves which node that
//     is: its new node's sequence is one above the highest that read
//     showed (and the read held two other contenders or more), or two
//     above when the node between is the requeue of the holder whose
//     delete woke it (a session's uuids on a key form a
//     chain, each the SHA-256 of the one before, so that node's name is
//     known). It watches that node at once; a guess that names no node is
//     followed by a read.
//   - On a queue of 32 children or more (WithHandoverRecords) a handover
//     record replaces the wake-up's read of every name: a head proven by a
//     wake-up releases with one multi that deletes its node and sets the
//     key node's data to "tenure-released <its name>" (guarded by the data
//     version it read; only empty data or a record is ever replaced). Its
//     successor reads that data: a record naming its predecessor, with its
//     own node there (known from a watch set on it at its create, or an
//     exists sent with the read), proves it first, since no node ahead of
//     a proven head can appear.
//     Anything else is followed by the read of the queue.
//   - The leader watches its own node from 10 ms into its term, and is
//     demoted when the node is deleted, or when another client changes its
//     data (zkfence, which checks the node's version, refuses the leader's
//     writes from then on; the node is then deleted, and the next candidate
//     leads); a node deleted or changed sooner is found so when that watch
//     is set. A term shorter than that (a lock held for a moment) sends no
//     request for the watch.
//   - When a create's reply is lost, the node is looked up by its uuid and
//     session. A node that an Enqueue may have made and could not keep
//     (the caller gave up, the link went down, the session expired) is
//     deleted in the background, by path or by uuid, whichever of the
//     connection's sessions owns it (go-zookeeper sends a request made
//     while it has no connection on its next one, whatever session that
//     carries): a node no campaign knows of would block the queue for as
//     long as its session lives.
//   - Session expiry is a loss even though go-zookeeper silently opens a new
//     session: the session is tied to the ZooKeeper session id it started
//     with.
//   - The lease deadline: the session confirms itself with a sync every
//     RenewInterval; on a single server (standalone, or an ensemble of
//     one) each reply moves the deadline to send time + session timeout −
//     margin. The negotiated session timeout must equal the TTL. A sync is
//     answered only after the ensemble's leader server, which expires
//     sessions, has seen it: a follower cut off from that server answers
//     reads from its own copy for up to syncLimit × tickTime, and a read
//     it answered would prove nothing.
//   - On an ensemble the leader server hears of a follower's client only
//     from the follower's answers to its pings (every tickTime/2), not
//     from the sync it forwarded: cut off just after it answered a sync, a
//     follower leaves the leader server counting from the packet before.
//     (A leader server cut off from its followers answers its own clients'
//     syncs for up to a tickTime after they began to elect another.) So on
//     an ensemble a reply moves the deadline to the send time of the
//     latest sync answered at least a quarter of the session timeout
//     before this one was sent (or of the connection's dial) + session
//     timeout − margin, and syncs go every TTL/8 if that is sooner. A
//     DeadlineMargin above 3/8 of the TTL is refused (on a single server
//     too: CheckDeadlineMargin). This assumes the
//     leader server pings at least that often (tickTime/2 ≤ timeout/4),
//     which holds unless the servers' minSessionTimeout is set under 2 ×
//     tickTime. Each connection reads /zookeeper/config to tell a single
//     server from an ensemble; until it has, it counts as an ensemble
//     (docs/zookeeper.md).
//   - Events arrive through a non-blocking callback (go-zookeeper drops
//     events when its channel is full).
//
// # Security
//
// By default the nodes tenure creates are open to everyone (world:anyone,
// all permissions), as they always were. WithDigestAuth authenticates the
// connection and restricts them to the same user; WithCreatorACL(true)
// lets everyone read them (observers). A request the server refuses
// (NoAuth) is tenure.ErrInvalidConfig. See docs/security.md.
//
// # Ownership
//
// A Backend owns one ZooKeeper connection, and so one ZooKeeper session;
// Sessions opened on it share that ZooKeeper session. Close the Backend after
// every Elector that uses it.
package zkelect
