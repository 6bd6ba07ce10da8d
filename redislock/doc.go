// Package redislock is tenure's Redis backend: a lock for efficiency, not
// for correctness.
//
// # What it guarantees, and what it does not
//
// Use it to avoid doing the same work twice: the report that four replicas
// would otherwise all build, the cache that every pod would warm. While
// Redis keeps its data, its clocks run at a sane rate and the holder is not
// paused longer than its deadline margin, one holder at a time runs. When
// any of those fails, two may run at once:
//
//   - A holder paused (GC, swapped out, SIGSTOP) past its TTL wakes up still
//     believing it holds; meanwhile the key expired and another took it.
//     tenure demotes a holder whose watchdog has not extended the key in
//     time, but a pause can begin after that check.
//   - A Redis failover to a replica that had not yet received the SET (Redis
//     replication is asynchronous) hands the lock to a second holder, and
//     the fencing counter on the replica can be lower than the one already
//     handed out.
//   - A clock jump on a Redis server expires keys early (Redlock assumes
//     bounded clock drift; see Martin Kleppmann's "How to do distributed
//     locking" and Salvatore Sanfilippo's reply).
//
// So the backend declares itself not linearizable
// (Backend.Linearizable() == false), its terms are advisory
// (tenure.Term.Advisory), and every API that needs a real fencing token
// refuses them: election.Mutex, fence.Require and fence.Guard.CheckTerm,
// pgfence's DoTerm, etcdfence and zkfence. For correctness use etcd
// (etcdelect) or ZooKeeper (zkelect). docs/redis.md says more.
//
// # The algorithm
//
//   - Acquire: a Lua script that runs SET key value NX PX ttl, where value
//     is "<random 128-bit hex> <token> <identity>" (a fresh random part per
//     campaign; the tries of one campaign share it), after INCR on the
//     key's counter "<key>:fence" for the token, and PUBLISHes on the
//     key's channel.
//   - Release and extend: Lua compare-and-delete and compare-and-pexpire on
//     the random part, so nobody deletes or extends someone else's lock.
//   - Watchdog: the session extends every held key every RenewInterval
//     (default TTL/3). Each extension is a lease renewal for tenure's core:
//     the deadline moves to send time + TTL - drift - DeadlineMargin, and
//     when it passes without one, the holder's context is cancelled before
//     the key can expire. An extension that finds the key gone or someone
//     else's ends the term at once (tenure.ErrOwnershipLost).
//   - Waiters: a candidate whose try fails is registered in the sorted set
//     "<key>:waiting" (renewed by its watchdog, dropped when not heard from
//     for a TTL) and listens on its session's channel for the key. A
//     release wakes one waiter, the one heard from least recently: it takes
//     it out of the set and PUBLISHes on that waiter's channel, and the
//     woken waiter tries at once (registering again if it loses). A handoff
//     costs a few commands and one message however many wait, and nobody
//     sleeps a random interval between retries. When no subscriber heard
//     the message (the waiter's process died, or its subscription is
//     down), the release wakes the next; a live waiter dropped that way
//     registers again on its watchdog's next round. A waiter that is not
//     woken (a lost message, or the woken waiter stalled or died on the
//     way) tries again when the holder's key would expire, at most a TTL
//     later.
//   - Late tries: a try whose reply was lost may still reach a master
//     after its campaign's clean-up. The clean-up of such a campaign (or
//     the watchdog, finding its key lost) leaves a tombstone,
//     "<key>:gone:<random>", for max(2 × TTL, 1 min), and a try that finds
//     its tombstone does nothing.
//   - Redlock: given N > 1 independent masters, an acquisition needs N/2+1
//     of them within the validity time (TTL - time spent - clock drift);
//     otherwise it is undone on all of them (its waiting registrations
//     stay), and an error names the masters that failed. Release and
//     extension go to every master.
//
// Waiters are not served in arrival order (Redis has no queue): whoever
// wins the race after a release holds.
//
// # Usage
//
//	b, err := redislock.Dial(ctx, []string{"127.0.0.1:6379"}, nil, redislock.Options{})
//	...
//	defer b.Close()
//	e, err := election.New(b, election.Config{Key: "report", Identity: host, TTL: 10 * time.Second})
//	...
//	defer e.Close(context.Background()) // releases the key; runs before b.Close
//	term, err := e.TryCampaign(ctx) // tenure.ErrLocked: someone else builds it
//
// All exported types are safe for concurrent use.
package redislock
