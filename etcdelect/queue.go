package etcdelect

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Enqueue puts "<key>/<lease hex>" with the identity under the session's
// lease unless the session already has that entry. The transaction is
// idempotent, so transient failures are retried until ctx ends (the elector
// ends it when the session can no longer be trusted). When it gives up with
// the put's outcome unknown, it ends the session and revokes its lease: the
// put may still be on its way, and may land after anything sent now (the
// client spreads requests over the endpoints, and a slow one can deliver the
// put after a fast one has delivered a delete), but a put under a revoked
// lease is refused whenever it lands. Kept alive, an entry no campaign knows
// of would hold the queue for as long as the session lives.
func (s *session) Enqueue(ctx context.Context, key, identity string) (election.Ticket, error) {
	if err := ctx.Err(); err != nil {
		return election.Ticket{}, err // nothing sent: the session stays
	}
	name := entryName(key, s.id)
	s.drainOwnWatch(name)
	var resp *clientv3.TxnResponse
	unknown := false // an earlier attempt failed with its outcome unknown
	for {
		var err error
		resp, err = s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(name), "=", 0)).
			Then(clientv3.OpPut(name, identity, clientv3.WithLease(s.id))).
			Else(clientv3.OpGet(name)).
			Commit()
		if err == nil {
			break
		}
		err = translate("enqueue", err)
		if errors.Is(err, tenure.ErrUnavailable) {
			unknown = true
			if pause(ctx) {
				continue
			}
		}
		switch {
		case errors.Is(err, tenure.ErrInvalidConfig) && !unknown:
			// Refused (permission denied): nothing was written. (After
			// an attempt whose outcome is unknown, a refusal, say of a
			// role that lost its permission meanwhile, proves nothing
			// of that attempt's put: the default case gives it up.)
		case errors.Is(err, tenure.ErrSessionExpired):
			s.expired(err) // the lease is gone, and any entry with it
		default:
			s.abandon(fmt.Errorf("a put of entry %s was given up with its outcome unknown: %w", name, err))
		}
		return election.Ticket{}, err
	}
	t := election.Ticket{Key: key, Identity: identity, Name: name, Token: uint64(resp.Header.Revision)}
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 { // deleted between the compare and the get: impossible in one txn
			return election.Ticket{}, tenure.ErrOwnershipLost
		}
		t.Token, t.Identity = uint64(kvs[0].CreateRevision), string(kvs[0].Value)
	}
	return t, nil
}

// abandonRevokeTimeout bounds the revoke of an abandoned session; when it
// fails, the lease, no longer renewed, expires a TTL after its last
// renewal.
const abandonRevokeTimeout = 2 * time.Second

// abandon ends the session, stops its renewals and revokes its lease,
// which deletes its entries and refuses any put still on its way.
func (s *session) abandon(cause error) {
	s.expired(cause)
	s.stop()
	<-s.loopDone
	ctx, cancel := context.WithTimeout(context.Background(), min(abandonRevokeTimeout, s.opts.TTL))
	defer cancel()
	_, _ = s.cli.Revoke(ctx, s.id)
}

// read returns t's own entry (nil when gone or replaced) and the newest
// entry of t's key older than it (nil when t is first), in one consistent
// read. With all, it lists every older entry instead, and ahead counts them
// (etcd's Count ignores create-revision filters). Keys under the prefix
// that are not entries (isEntry: nested keys' entries "<key>/<sub>/<lease>",
// another client's data) are not contenders.
//
// Without all, the queue is read keys-only, which etcd serves from its
// in-memory index without reading a single value: the head check on every
// handoff costs no disk reads however long the queue. Keys-only results
// carry no lease, so a predecessor whose name looks like an entry is
// returned unverified (verified false); waitDelete checks its lease if it
// outlives a TTL (an entry someone put by hand, without a lease, would
// block the queue forever). When the newest older key's name is not an
// entry's, the older keys are listed with their leases: the newest entry
// on its lease, or, when newer, the newest entry-named key off its lease
// not skipped yet (returned unverified: a detached entry's holder may lead
// until its deadline).
//
// With minRev > 0, the read may be served from the connected member's own
// store without a round of agreement (serializable), if that store has
// reached minRev; otherwise it is read again, linearizably. A store at
// revision minRev or later is a state the cluster committed, and entries
// older than t never appear later, so "none older than t" read there
// holds from then on.
func (s *session) read(ctx context.Context, t election.Ticket, all bool, minRev int64) (own, pred *mvccpb.KeyValue, verified bool, ahead int, rev, size int64, err error) {
	older := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(int64(t.Token) - 1)}
	before := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(int64(t.Token)-1), clientv3.WithKeysOnly())
	if all {
		before = older
	}
	ownOpts := []clientv3.OpOption{clientv3.WithKeysOnly()}
	if minRev > 0 {
		ownOpts = append(ownOpts, clientv3.WithSerializable())
		before = append(slices.Clip(before), clientv3.WithSerializable())
	}
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(t.Name, ownOpts...),
		clientv3.OpGet(prefix(t.Key), before...),
	).Commit()
	if err != nil {
		return nil, nil, false, 0, 0, 0, translate("read queue", err)
	}
	if minRev > 0 && resp.Header.Revision < minRev {
		return s.read(ctx, t, all, 0) // the member lags what we saw: agree first
	}
	rev = resp.Header.Revision
	if own, err = s.ownEntry(ctx, t, resp.Responses[0].GetResponseRange().Kvs, rev); err != nil {
		return nil, nil, false, 0, 0, 0, err
	}
	size = resp.Responses[1].GetResponseRange().Count
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if !all && len(kvs) > 0 {
		if _, ok := parseEntry(t.Key, kvs[0].Key); ok && !s.skipped(kvs[0]) {
			return own, kvs[0], false, 1, rev, size, nil
		}
		r, err := s.cli.Get(ctx, prefix(t.Key), append(older, clientv3.WithRev(rev))...)
		if err != nil {
			return nil, nil, false, 0, 0, 0, translate("read queue", err)
		}
		kvs = r.Kvs
	}
	var detached *mvccpb.KeyValue // named as an entry, not on its lease
	for _, kv := range kvs {
		if !isEntry(t.Key, kv) {
			if _, ok := parseEntry(t.Key, kv.Key); ok && !s.skipped(kv) && (detached == nil || kv.CreateRevision > detached.CreateRevision) {
				detached = kv
			}
			continue
		}
		ahead++
		if pred == nil || kv.CreateRevision > pred.CreateRevision {
			pred = kv
		}
	}
	if detached != nil && (pred == nil || detached.CreateRevision > pred.CreateRevision) {
		// Detached from its lease (etcdctl put <entry> x), or another
		// client's key named like an entry: wait on it as unverified,
		// so that waitDelete looks at it a TTL from now before it is
		// skipped. A holder cut off from etcd may lead until its
		// deadline after its entry was detached.
		return own, detached, false, ahead, rev, size, nil
	}
	return own, pred, true, ahead, rev, size, nil
}

// ownEntry returns t's entry from kvs, a keys-only read of its name at rev,
// or nil when it is gone or no longer t's.
func (s *session) ownEntry(ctx context.Context, t election.Ticket, kvs []*mvccpb.KeyValue, rev int64) (*mvccpb.KeyValue, error) {
	if len(kvs) != 1 || uint64(kvs[0].CreateRevision) != t.Token {
		return nil, nil
	}
	if kvs[0].Version == 1 {
		return kvs[0], nil
	}
	// tenure puts an entry once: someone else has written it since. A
	// keys-only read carries no lease; read the entry whole, and count it
	// as ours only if it is still attached to the session's lease (waiters
	// count an entry without it as no contender).
	g, err := s.cli.Get(ctx, t.Name, clientv3.WithRev(rev))
	if err != nil {
		return nil, translate("read own entry", err)
	}
	if len(g.Kvs) != 1 || uint64(g.Kvs[0].CreateRevision) != t.Token || clientv3.LeaseID(g.Kvs[0].Lease) != s.id {
		return nil, nil
	}
	return kvs[0], nil
}

// Ahead counts the entries older than t.
func (s *session) Ahead(ctx context.Context, t election.Ticket) (int, error) {
	own, _, _, n, _, _, err := s.read(ctx, t, true, 0)
	if err != nil {
		return 0, err
	}
	if own == nil {
		return 0, s.lost(ctx, t)
	}
	return n, nil
}

// retryPause is the pause after a transient failure while waiting. The
// elector's lease deadline bounds how long a waiter keeps retrying.
const retryPause = 50 * time.Millisecond

// WaitHead implements election.Session. Tokens are set at Enqueue, so t
// comes back unchanged.
func (s *session) WaitHead(ctx context.Context, t election.Ticket) (election.Ticket, error) {
	return t, s.waitHead(ctx, t)
}

// waitHead waits until no entry older than t remains. It watches only the
// newest older entry (the predecessor) and t's own entry. Transient failures
// are retried until ctx ends; the elector ends ctx when the session can no
// longer be trusted.
func (s *session) waitHead(ctx context.Context, t election.Ticket) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var ow *ownWatch // counted as in use until waitHead returns or drops it
	defer func() {
		if ow != nil {
			s.useOwnWatch(ow, -1)
		}
	}()
	var seen int64 // the revision of the predecessor's delete, once seen
	var (
		delRev int64            // the revision of that delete, when an event showed it
		pred   *mvccpb.KeyValue // the predecessor waited on last
		size   int64            // keys under the prefix at the last queue read
	)
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := s.ended(); err != nil {
			return err
		}
		if ow == nil {
			var err error
			if ow, err = s.ownWatch(ctx, t.Name); err != nil {
				if errors.Is(err, tenure.ErrInvalidConfig) {
					return err // refused (permission denied): waiting will not help
				}
				if !pause(ctx) {
					return ctx.Err()
				}
				continue
			}
		}
		// After a wake-up the read need only reach the revision of the
		// predecessor's delete, of t's entry, and of the own-entry watch's
		// start (so that the watch covers whatever the read does not): no
		// round of agreement, which would wait behind other writes' log
		// syncs.
		minRev := int64(0)
		if seen > 0 {
			minRev = max(seen, ow.rev, int64(t.Token))
		}
		if delRev > 0 && s.handoverOn(size) {
			// Released by a proven head? Then no read of the queue.
			rctx, rcancel := s.bounded(ctx)
			own, decided, err := s.readHandover(rctx, t, pred, delRev, minRev)
			rcancel()
			switch {
			case errors.Is(err, tenure.ErrInvalidConfig):
				// The role does not cover the record: the queue it is.
				s.noHandover.Store(true)
			case err == nil && decided && own == nil:
				return s.lost(ctx, t)
			case err == nil && decided:
				s.prove(ow, t)
				s.markHead(t, size)
				return nil
			}
			// Undecided, or failed: read the queue.
		}
		delRev = 0
		type queueRead struct {
			own, pred *mvccpb.KeyValue
			verified  bool
			rev, size int64
		}
		q, err := hedged(ctx, s, func(ctx context.Context) (queueRead, error) {
			own, p, verified, _, rev, n, err := s.read(ctx, t, false, minRev)
			return queueRead{own, p, verified, rev, n}, err
		})
		own, p, verified, rev, n := q.own, q.pred, q.verified, q.rev, q.size
		seen = 0
		if err != nil {
			if errors.Is(err, tenure.ErrInvalidConfig) {
				return err
			}
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				continue // both tries over the bound: at once again
			}
			if !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		if own == nil {
			return s.lost(ctx, t)
		}
		pred, size = p, n
		if pred == nil {
			// First in the queue, and the same read shows our own entry,
			// read after the own-entry watch existed: WatchLoss can rely on
			// that watch without reading again.
			s.prove(ow, t)
			s.markHead(t, size)
			return nil
		}
		seen, delRev, err = s.waitDelete(wctx, ctx, t, pred, verified, rev, ow)
		switch {
		case errors.Is(err, errOwnGone):
			return s.lost(ctx, t)
		case errors.Is(err, errOwnWatch), errors.Is(err, errSilentStream):
			// Failed, or (silent stream) most likely on the predecessor
			// watch's stream: make it anew, on the current stream.
			s.dropOwnWatch(t.Name, ow)
			s.useOwnWatch(ow, -1)
			ow = nil
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		}
	}
}

var (
	errOwnGone      = errors.New("own entry deleted")
	errOwnWatch     = errors.New("own watch failed")
	errSilentStream = errors.New("the predecessor's watch stream did not answer a progress request")
)

// waitDelete waits until pred is deleted. The watch starts at the current
// revision (a synced watcher, delivered at once), and pred is re-read after
// the watch exists, so a delete in between is not missed. It returns nil
// when pred is gone or on a transient failure (the caller re-reads), with
// the revision of the watch response that showed pred gone (0 when no
// event showed it) and, when that event was pred's delete, the delete's
// revision (0 otherwise),
// errOwnGone when t's entry was deleted, errOwnWatch when the own-entry
// watch failed. An unverified pred (read keys-only) that is still there a
// TTL later has its lease checked once, and so has one detached from its
// lease meanwhile (a TTL after the detach): one without its lease is no
// entry, and the caller re-reads the queue with leases.
func (s *session) waitDelete(wctx, ctx context.Context, t election.Ticket, pred *mvccpb.KeyValue, verified bool, readRev int64, ow *ownWatch) (seen, delRev int64, err error) {
	armedRev := readRev // a look is due a TTL after pred stood as at this revision
	pw, err := s.startWatch(ctx, wctx, string(pred.Key))
	if err != nil {
		pause(ctx)
		return 0, 0, err
	}
	defer pw.cancel()
	pctx, pch, createdRev, stream := pw.ctx, pw.ch, pw.rev, pw.stream
	// When nothing was written between the read and the watch's creation,
	// the predecessor still exists and every change to it is delivered.
	// Otherwise, re-read it. Its name is "<key>/<its lease>", reused by
	// every campaign of its session: compare the create revision, not the
	// name, or a predecessor that resigned and re-queued (behind us) before
	// the watch existed is mistaken for the one we wait for, and we wait
	// forever.
	detachedMeanwhile := false
	if createdRev > readRev {
		gctx, gcancel := s.bounded(ctx)
		g, err := s.cli.Get(gctx, string(pred.Key))
		gcancel()
		if err != nil {
			pause(ctx)
			return 0, 0, err
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
			return 0, 0, nil
		}
		// Detached between the read and the watch: no event will say
		// so (see the detach case below).
		detachedMeanwhile = verified && !isEntry(t.Key, g.Kvs[0])
		armedRev = g.Header.Revision
	}
	var verify <-chan time.Time
	var vt *time.Timer
	look := func() { // (again) a TTL from now
		if vt == nil {
			vt = time.NewTimer(s.opts.TTL)
		} else {
			vt.Reset(s.opts.TTL)
		}
		verify = vt.C
	}
	defer func() {
		if vt != nil {
			vt.Stop()
		}
	}()
	if !verified || detachedMeanwhile {
		look()
	}
	// Whether pred was on its lease as of the last change seen: known
	// when read with its lease (verified) or from an event. A look is
	// re-armed only when pred is detached from its lease, not on every
	// write to a key that is off one already (another client's key named
	// like an entry, rewritten every few seconds, would otherwise be
	// looked at never, and the queue would stop behind it).
	attached, known := !detachedMeanwhile, verified
	// A renewal whose second request answered while its first still
	// waits points to a connection that went silent (no reset): the
	// client never finds it dead without keepalive pings, and a watch on
	// its stream never delivers. Ask the stream for a progress notice
	// then; none within the bound, and the wait starts again on another
	// stream.
	var suspect <-chan struct{}
	if s.bound() > 0 {
		suspect = s.suspicion()
	}
	var probe <-chan time.Time
	var pt *time.Timer
	defer func() {
		if pt != nil {
			pt.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-suspect:
			suspect = s.suspicion()
			if probe != nil {
				continue // one asked already
			}
			b := s.bound()
			rctx, rcancel := context.WithTimeout(pctx, b)
			err := s.cli.RequestProgress(rctx)
			rcancel()
			if err != nil {
				continue
			}
			if pt == nil {
				pt = time.NewTimer(b)
			} else {
				pt.Reset(b)
			}
			probe = pt.C
		case <-probe:
			s.silentStream(stream)
			return 0, 0, errSilentStream
		case wr, ok := <-pch:
			if !ok || wr.Err() != nil {
				pause(ctx)
				return 0, 0, errors.New("predecessor watch failed")
			}
			if probe != nil { // the stream answers
				pt.Stop()
				probe = nil
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					if ev.Kv.ModRevision <= pred.CreateRevision {
						// An earlier entry of the same name (the same
						// session's previous campaign), from a member
						// that lags the read: not pred's delete, and
						// nothing about pred. Its later events follow.
						continue
					}
					return wr.Header.Revision, ev.Kv.ModRevision, nil
				}
				if ev.Kv.CreateRevision != pred.CreateRevision {
					return wr.Header.Revision, 0, nil // deleted and put again
				}
				now := isEntry(t.Key, ev.Kv)
				if !now && (attached || !known) {
					// Detached from its lease (etcdctl put <entry> x): no
					// lease will end it. Its holder learns of it from the
					// same event, or, cut off, demotes at its deadline:
					// within a TTL either way. Look again a full TTL from
					// this event, whatever look was due sooner.
					armedRev = ev.Kv.ModRevision
					look()
				}
				attached, known = now, true
			}
		case wr, ok := <-ow.ch:
			if !ok || wr.Err() != nil {
				return 0, 0, errOwnWatch
			}
			for _, ev := range wr.Events {
				if lostBy(ev, t.Token, s.id) {
					return 0, 0, errOwnGone
				}
			}
		case <-verify:
			verify = nil
			gctx, gcancel := s.bounded(ctx)
			g, err := s.cli.Get(gctx, string(pred.Key))
			gcancel()
			if err != nil {
				pause(ctx)
				return 0, 0, err
			}
			if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
				return 0, 0, nil // gone meanwhile
			}
			if !isEntry(t.Key, g.Kvs[0]) {
				if g.Kvs[0].ModRevision > armedRev && s.attachedAt(ctx, t.Key, pred, armedRev) {
					// Detached after the look was armed (as it came due,
					// its event not read yet): a full TTL from the
					// latest change.
					armedRev = g.Kvs[0].ModRevision
					attached, known = false, true
					look()
					continue
				}
				s.skip(g.Kvs[0])
				s.skipStale(ctx, t, readRev)
				return 0, 0, nil
			}
		}
	}
}

// attachedAt reports whether pred's key, as created at pred's create
// revision, was on its lease at revision rev; true also when that cannot
// be read (compacted, a failed read): a look is then armed again.
func (s *session) attachedAt(ctx context.Context, key string, pred *mvccpb.KeyValue, rev int64) bool {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	g, err := s.cli.Get(ctx, string(pred.Key), clientv3.WithRev(rev))
	if err != nil {
		return true
	}
	return len(g.Kvs) == 1 && g.Kvs[0].CreateRevision == pred.CreateRevision && isEntry(key, g.Kvs[0])
}

// skipStale skips every key older than t named like an entry and off its
// lease that has not changed since readRev, a TTL or more ago: a holder of
// any of them has passed its deadline. Without it, a waiter behind several
// such keys (left by hand, or detached) would wait a TTL for each in turn.
func (s *session) skipStale(ctx context.Context, t election.Ticket, readRev int64) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	r, err := s.cli.Get(ctx, prefix(t.Key), clientv3.WithPrefix(), clientv3.WithMaxCreateRev(int64(t.Token)-1))
	if err != nil {
		return // the next read finds them one at a time
	}
	present := map[string]int64{}
	for _, kv := range r.Kvs {
		present[string(kv.Key)] = kv.CreateRevision
		if _, ok := parseEntry(t.Key, kv.Key); ok && !isEntry(t.Key, kv) && kv.ModRevision <= readRev {
			s.skip(kv)
		}
	}
	// Forget skipped keys of this election that are gone: the list would
	// otherwise grow for the session's life.
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	for name, rev := range s.foreign {
		if _, ok := parseEntry(t.Key, []byte(name)); ok && rev < int64(t.Token) {
			if c, there := present[name]; !there || c != rev {
				delete(s.foreign, name)
			}
		}
	}
}

// lostBy reports whether ev, from the watch on a session's entry name,
// ends the entry created at revision token under lease: a delete after it,
// a put of a newer entry, or a put that detaches it from the lease (such as
// `etcdctl put <entry> x`, after which the waiters no longer count it as an
// entry). Events of the session's earlier entries under the same name (a
// resigned term's delete, its put) are older and do not count.
func lostBy(ev *clientv3.Event, token uint64, lease clientv3.LeaseID) bool {
	if ev.Type == clientv3.EventTypeDelete {
		return uint64(ev.Kv.ModRevision) > token
	}
	c := uint64(ev.Kv.CreateRevision)
	return c > token || c == token && clientv3.LeaseID(ev.Kv.Lease) != lease
}

// WatchLoss waits until t's entry is deleted or replaced. It reads from the
// session's watch on the entry's name; when that is the watch WaitHead's
// last read came after, it need not read again.
func (s *session) WatchLoss(ctx context.Context, t election.Ticket) error {
	for {
		if ctx.Err() != nil { // resigned before the watcher got here
			return ctx.Err()
		}
		if err := s.ended(); err != nil {
			return err
		}
		w, err := s.ownWatch(ctx, t.Name)
		if err != nil {
			if !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		err = s.awaitOwnLoss(ctx, w, t)
		s.useOwnWatch(w, -1)
		switch {
		case errors.Is(err, errOwnGone):
			return s.lost(ctx, t)
		case err == nil:
			return ctx.Err()
		case errors.Is(err, errOwnWatch):
			s.dropOwnWatch(t.Name, w)
		}
		// A failed watch (dropped: the next ownWatch makes a new one) or
		// read: try again.
		if !pause(ctx) {
			return ctx.Err()
		}
	}
}

// awaitOwnLoss is one WatchLoss attempt on w, which the caller holds: it
// returns errOwnGone, errOwnWatch, another error when a read failed, or
// nil when ctx ends.
func (s *session) awaitOwnLoss(ctx context.Context, w *ownWatch, t election.Ticket) error {
	if !s.provenBy(w, t) {
		// A newer watch: every change after its creation is in it, and
		// this read shows whether the entry outlived the old one.
		g, err := s.cli.Get(ctx, t.Name)
		if err != nil {
			return err
		}
		if len(g.Kvs) == 0 || uint64(g.Kvs[0].CreateRevision) != t.Token || clientv3.LeaseID(g.Kvs[0].Lease) != s.id {
			return errOwnGone
		}
		s.prove(w, t)
	}
	return awaitLoss(ctx, w.ch, t, s.id)
}

// awaitLoss returns errOwnGone when t's entry is deleted, replaced or
// detached from lease, errOwnWatch when the watch fails, nil when ctx ends.
func awaitLoss(ctx context.Context, wch clientv3.WatchChan, t election.Ticket, lease clientv3.LeaseID) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return errOwnWatch
			}
			for _, ev := range wr.Events {
				if lostBy(ev, t.Token, lease) {
					return errOwnGone
				}
			}
		}
	}
}

// ownWatch is the session's watch on one of its entry names,
// "<key>/<lease>". Every campaign of the session on that key uses the same
// name, so one watch, created once, serves them all (each skips the events
// of the entries before its own, see lostBy): a candidate that campaigns
// again costs the server no new watch. Its consumers take turns (an
// Elector's campaigns and terms do not overlap). It lives until it fails
// or the session ends.
type ownWatch struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
	rev    int64 // the store's revision when the server created it
	users  int   // callers holding it (ownWatch, useOwnWatch); guarded by session.ownMu
}

// useOwnWatch counts a holder of w in (d = 1) or out (d = -1).
func (s *session) useOwnWatch(w *ownWatch, d int) {
	s.ownMu.Lock()
	w.users += d
	s.ownMu.Unlock()
}

// ownWatch returns the session's live watch on name, creating it (and
// waiting for the server to acknowledge it) on first use, counted as in
// use: the caller ends its use with useOwnWatch(w, -1).
func (s *session) ownWatch(ctx context.Context, name string) (*ownWatch, error) {
	s.ownMu.Lock()
	w := s.owns[name]
	if w != nil {
		w.users++
	}
	s.ownMu.Unlock()
	if w != nil {
		return w, nil
	}
	sw, err := s.startWatch(ctx, clientv3.WithRequireLeader(s.ctx), name)
	if err != nil {
		return nil, err
	}
	cancel := sw.cancel
	w = &ownWatch{ch: sw.ch, cancel: cancel, rev: sw.rev}
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if old := s.owns[name]; old != nil { // created meanwhile by another call
		cancel()
		old.users++
		return old, nil
	}
	if s.owns == nil {
		s.owns = map[string]*ownWatch{}
	}
	w.users = 1
	s.owns[name] = w
	return w, nil
}

// bounded returns ctx bounded by s.bound(), if any.
func (s *session) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if b := s.bound(); b > 0 {
		return context.WithTimeout(ctx, b)
	}
	return context.WithCancel(ctx)
}

// hedged runs f with a ctx that ends after s.bound(), and when it has not
// returned after a quarter of that (500 ms at most), runs it once more
// beside it: etcd's client sends each request on its next connection in
// turn, and a connection that went silent (no reset) would hold every
// other read until the bound, in step with whatever else the client sends
// between them. The first success is returned, or the last error, when
// both failed; the other try is cancelled. Without a bound (one
// endpoint), f runs once, on ctx.
func hedged[T any](ctx context.Context, s *session, f func(context.Context) (T, error)) (T, error) {
	bound := s.bound()
	if bound == 0 {
		return f(ctx)
	}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	results := make(chan result, 2)
	try := func() {
		v, err := f(ctx)
		results <- result{v, err}
	}
	go try()
	hedge := time.NewTimer(min(bound/4, 500*time.Millisecond))
	defer hedge.Stop()
	pending := 1
	var last result
	for {
		select {
		case <-hedge.C:
			pending++
			go try()
		case r := <-results:
			pending--
			if r.err == nil {
				// The other try, if any, ends with ctx (cancel, deferred)
				// and sends into the buffer.
				s.inTime()
				return r.v, nil
			}
			last = r
			if pending == 0 {
				if errors.Is(last.err, context.DeadlineExceeded) && outer.Err() == nil {
					s.timedOut(bound)
				}
				return last.v, last.err
			}
		}
	}
}

// startedWatch is a watch startWatch made.
type startedWatch struct {
	ctx    context.Context // the watch's: its metadata names its gRPC stream
	cancel context.CancelFunc
	ch     clientv3.WatchChan
	rev    int64  // the store's revision when the server created it
	stream uint64 // the stream number it went on (watchCtx)
}

// startWatch watches key, on a ctx made from base, and waits for the
// server to acknowledge the watch. etcd's client opens a stream's gRPC
// stream before it takes the stream's first watch, and on a connection
// that went silent (no reset) neither that nor the acknowledgement ever
// comes: after s.bound() (if any: not with one endpoint) the watch is
// cancelled, its stream taken for silent, and the watch made again, at
// once, on a new stream, which the client's round robin sends on its next
// connection; up to one try per endpoint. A try ends early when ctx does.
func (s *session) startWatch(ctx, base context.Context, key string) (startedWatch, error) {
	tries := min(max(len(s.cli.Endpoints()), 1), 5)
	for try := 1; ; try++ {
		bound := s.bound()
		n := s.streams.Load()
		wctx, cancel := context.WithCancel(s.watchCtx(base, n))
		type started struct {
			ch  clientv3.WatchChan
			rev int64
			err error
		}
		done := make(chan started, 1)
		go func() {
			ch := s.cli.Watch(wctx, key, clientv3.WithCreatedNotify())
			rev, err := awaitCreatedRev(wctx, ch)
			done <- started{ch, rev, err}
		}()
		var expired <-chan time.Time
		if bound > 0 {
			t := time.NewTimer(bound)
			defer t.Stop()
			expired = t.C
		}
		select {
		case r := <-done:
			if r.err != nil {
				cancel()
				return startedWatch{}, r.err
			}
			if bound > 0 {
				s.inTime()
			}
			return startedWatch{ctx: wctx, cancel: cancel, ch: r.ch, rev: r.rev, stream: n}, nil
		case <-expired:
			cancel()
			<-done
			s.timedOut(bound)
			s.silentStream(n)
			if try < tries {
				continue
			}
			return startedWatch{}, fmt.Errorf("%w: etcd watch on %s not acknowledged in %v, on %d streams", tenure.ErrUnavailable, key, bound, tries)
		case <-ctx.Done():
			cancel()
			<-done
			return startedWatch{}, ctx.Err()
		}
	}
}

// drainOwnWatch reads, without waiting, what the session's watch on name
// has delivered while nobody read it. Between terms nobody waits on that
// watch, and a standby that polls TryCampaign puts and deletes its entry
// on every refused try: the client would keep every one of those events
// until the next won term. It does nothing while a consumer (WaitHead,
// WatchLoss) reads the watch, whose events may be that consumer's; and
// holding ownMu, it keeps any from starting meanwhile. Called before
// Enqueue's write, it reads only events older than the entry that write
// makes. A failed watch is dropped.
func (s *session) drainOwnWatch(name string) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	w := s.owns[name]
	if w == nil || w.users > 0 {
		return
	}
	// The client hands responses over one at a time from its own
	// goroutine: after each one read, let it run before looking again.
	for read := false; ; {
		select {
		case wr, ok := <-w.ch:
			if !ok || wr.Err() != nil {
				s.dropOwnWatchLocked(name, w)
				return
			}
			read = true
			if s.proved == w {
				// What was read may be a proven entry's loss: its WatchLoss
				// must read the entry again.
				s.proved = nil
			}
			continue
		default:
		}
		if !read {
			return
		}
		read = false
		runtime.Gosched()
	}
}

// dropOwnWatch cancels w, a failed watch, so that the next ownWatch makes
// a new one.
func (s *session) dropOwnWatch(name string, w *ownWatch) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	s.dropOwnWatchLocked(name, w)
}

// dropOwnWatchLocked is dropOwnWatch with ownMu held.
func (s *session) dropOwnWatchLocked(name string, w *ownWatch) {
	if s.owns[name] == w {
		delete(s.owns, name)
	}
	if s.proved == w {
		s.proved = nil
	}
	w.cancel()
}

// prove records that a read made after w existed showed t's entry.
func (s *session) prove(w *ownWatch, t election.Ticket) {
	s.ownMu.Lock()
	s.proved, s.proven = w, t.Token
	s.ownMu.Unlock()
}

// provenBy reports whether a read made after w existed showed t's entry.
func (s *session) provenBy(w *ownWatch, t election.Ticket) bool {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	return s.proved == w && s.proven == t.Token
}

// skip records kv, a key under an election prefix that looks like an entry
// but is not attached to its lease, so that reads list around it.
func (s *session) skip(kv *mvccpb.KeyValue) {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.foreign == nil {
		s.foreign = map[string]int64{}
	}
	s.foreign[string(kv.Key)] = kv.CreateRevision
}

// skipped reports whether kv was recorded by skip.
func (s *session) skipped(kv *mvccpb.KeyValue) bool {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	rev, ok := s.foreign[string(kv.Key)]
	return ok && rev == kv.CreateRevision
}

func pause(ctx context.Context) bool {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
