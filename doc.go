// Package tenure holds the vocabulary that every tenure package shares: the
// Term a leader holds, the Leader an observer sees, the Callbacks an elector
// runs, and the sentinel errors.
//
// # Guarantees
//
//   - A Term's Token is a fencing token. On a linearizable backend (etcd,
//     ZooKeeper) every new leader of a key holds a strictly larger Token than
//     every leader before it. A resource that remembers the largest Token it
//     has accepted and refuses smaller ones cannot be written by a stale
//     leader, even one that paused past its lease and woke up believing it
//     still leads. The lock itself cannot give that guarantee: only the
//     resource's check can.
//   - A leader never outlives its lease: the elector demotes itself when the
//     lease deadline (send time of the last acknowledged renewal + TTL −
//     margin, on the local monotonic clock) passes, before the server can
//     expire the lease and elect someone else. (On a ZooKeeper ensemble a
//     renewal counts from an older one that the leader server has surely
//     heard of, even through a follower; this assumes the servers grant no
//     session timeout under 2 × tickTime, their default: see zkelect.)
//   - What tenure does not guarantee: that the code running under a Term has
//     stopped by the time another leader starts, if that code ignores its
//     context and outlives the hard-stop timeout. Fence the resource.
//
// The election itself lives in package election; backends live in etcdelect
// (etcd), zkelect (ZooKeeper) and redislock (Redis, whose terms are
// advisory: see Term.Advisory).
package tenure
