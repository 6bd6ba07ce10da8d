package etcdelect

import (
	"context"
	"errors"
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
// the outcome unknown, it deletes the entry on a fresh context.
func (s *session) Enqueue(ctx context.Context, key, identity string) (election.Ticket, error) {
	name := entryName(key, s.id)
	var resp *clientv3.TxnResponse
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
		if !errors.Is(err, tenure.ErrUnavailable) || !pause(ctx) {
			s.deleteOwn(ctx, name)
			return election.Ticket{}, err
		}
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

// deleteOwn deletes name if it is attached to this session's lease.
func (s *session) deleteOwn(ctx context.Context, name string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.TTL)
	defer cancel()
	_, _ = s.cli.Txn(cctx).
		If(clientv3.Compare(clientv3.LeaseValue(name), "=", s.id)).
		Then(clientv3.OpDelete(name)).
		Commit()
}

// read returns t's own entry (nil when gone or replaced) and the newest
// entry of t's key older than it (nil when t is first), in one consistent
// read. With all, it lists the names of every older entry instead, and ahead
// counts them (etcd's Count ignores create-revision filters). Keys under
// the prefix that are not entries (isEntry: nested keys' entries
// "<key>/<sub>/<lease>", another client's data) are not contenders: when the
// newest older key is one, the older keys are listed and filtered.
func (s *session) read(ctx context.Context, t election.Ticket, all bool) (own, pred *mvccpb.KeyValue, ahead int, rev int64, err error) {
	// Not WithKeysOnly: etcd serves keys-only ranges from its index, without
	// the entries' leases, which isEntry needs.
	older := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithMaxCreateRev(int64(t.Token) - 1)}
	before := append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(int64(t.Token)-1))
	if all {
		before = older
	}
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(t.Name),
		clientv3.OpGet(prefix(t.Key), before...),
	).Commit()
	if err != nil {
		return nil, nil, 0, 0, translate("read queue", err)
	}
	rev = resp.Header.Revision
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 && uint64(kvs[0].CreateRevision) == t.Token {
		own = kvs[0]
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if !all && len(kvs) > 0 && !isEntry(t.Key, kvs[0]) {
		r, err := s.cli.Get(ctx, prefix(t.Key), append(older, clientv3.WithRev(rev))...)
		if err != nil {
			return nil, nil, 0, 0, translate("read queue", err)
		}
		kvs = r.Kvs
	}
	for _, kv := range kvs {
		if !isEntry(t.Key, kv) {
			continue
		}
		ahead++
		if pred == nil || kv.CreateRevision > pred.CreateRevision {
			pred = kv
		}
	}
	return own, pred, ahead, rev, nil
}

// Ahead counts the entries older than t.
func (s *session) Ahead(ctx context.Context, t election.Ticket) (int, error) {
	own, _, n, _, err := s.read(ctx, t, true)
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

// WaitHead waits until no entry older than t remains. It watches only the
// newest older entry (the predecessor) and t's own entry. Transient failures
// are retried until ctx ends; the elector ends ctx when the session can no
// longer be trusted.
// WaitHead implements election.Session. Tokens are set at Enqueue, so t
// comes back unchanged.
func (s *session) WaitHead(ctx context.Context, t election.Ticket) (election.Ticket, error) {
	return t, s.waitHead(ctx, t)
}

func (s *session) waitHead(ctx context.Context, t election.Ticket) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	var ow *ownWatch
	defer func() {
		if ow != nil {
			ow.cancel()
		}
	}()
	var ownCh clientv3.WatchChan
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ow == nil {
			ow = s.watchOwn(t)
			ownCh = ow.ch
			if err := awaitCreated(ctx, ownCh); err != nil {
				ow.cancel()
				ow = nil
				if errors.Is(err, tenure.ErrInvalidConfig) {
					return err // refused (permission denied): waiting will not help
				}
				if !pause(ctx) {
					return ctx.Err()
				}
				continue
			}
		}
		own, pred, _, rev, err := s.read(ctx, t, false)
		if err != nil {
			if errors.Is(err, tenure.ErrInvalidConfig) {
				return err
			}
			if !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		if own == nil {
			return s.lost(ctx, t)
		}
		if pred == nil {
			// First in the queue, and the same read shows our own entry.
			// Hand the own-entry watch, created before that read, to
			// WatchLoss: the new leader need not watch and read again.
			s.handOver(ow)
			ow = nil
			return nil
		}
		switch err := s.waitDelete(wctx, ctx, pred, rev, ownCh); {
		case errors.Is(err, errOwnGone):
			return s.lost(ctx, t)
		case errors.Is(err, errOwnWatch):
			ow.cancel()
			ow = nil
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		}
	}
}

var (
	errOwnGone  = errors.New("own entry deleted")
	errOwnWatch = errors.New("own watch failed")
)

// waitDelete waits until pred is deleted. The watch starts at the current
// revision (a synced watcher, delivered at once), and pred is re-read after
// the watch exists, so a delete in between is not missed. It returns nil
// when pred is gone or on a transient failure (the caller re-reads),
// errOwnGone when our own entry was deleted.
func (s *session) waitDelete(wctx, ctx context.Context, pred *mvccpb.KeyValue, readRev int64, ownCh clientv3.WatchChan) error {
	pctx, cancel := context.WithCancel(wctx)
	defer cancel()
	pch := s.cli.Watch(pctx, string(pred.Key), clientv3.WithCreatedNotify())
	createdRev, err := awaitCreatedRev(ctx, pch)
	if err != nil {
		pause(ctx)
		return err
	}
	// When nothing was written between the read and the watch's creation,
	// the predecessor still exists and every change to it is delivered.
	// Otherwise, re-read it. Its name is "<key>/<its lease>", reused by
	// every campaign of its session: compare the create revision, not the
	// name, or a predecessor that resigned and re-queued (behind us) before
	// the watch existed is mistaken for the one we wait for, and we wait
	// forever.
	if createdRev > readRev {
		g, err := s.cli.Get(ctx, string(pred.Key), clientv3.WithKeysOnly())
		if err != nil {
			pause(ctx)
			return err
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
			return nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-pch:
			if !ok || wr.Err() != nil {
				pause(ctx)
				return errors.New("predecessor watch failed")
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != pred.CreateRevision {
					return nil
				}
			}
		case wr, ok := <-ownCh:
			if !ok || wr.Err() != nil {
				return errOwnWatch
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return errOwnGone
				}
			}
		}
	}
}

// WatchLoss waits until t's entry is deleted or replaced.
func (s *session) WatchLoss(ctx context.Context, t election.Ticket) error {
	if w := s.takeOver(t); w != nil {
		// WaitHead's last read, made after this watch existed, showed the
		// entry: every later change is in the channel.
		err := awaitLoss(ctx, w.ch, t)
		w.cancel()
		if err != nil {
			return s.lost(ctx, t)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for {
		if ctx.Err() != nil { // resigned before the watcher got here
			return ctx.Err()
		}
		if s.watchLossOnce(ctx, t) {
			return s.lost(ctx, t)
		}
		if ctx.Err() != nil || !pause(ctx) {
			return ctx.Err()
		}
	}
}

// watchLossOnce watches t's entry until it is lost (true) or the watch fails
// or ctx ends (false). The watch ends with it.
func (s *session) watchLossOnce(ctx context.Context, t election.Ticket) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, t.Name, clientv3.WithCreatedNotify())
	if err := awaitCreated(ctx, wch); err != nil {
		return false
	}
	g, err := s.cli.Get(ctx, t.Name, clientv3.WithKeysOnly())
	if err != nil {
		return false
	}
	if len(g.Kvs) == 0 || uint64(g.Kvs[0].CreateRevision) != t.Token {
		return true
	}
	return awaitLoss(ctx, wch, t) != nil
}

// awaitLoss returns errOwnGone when t's entry is deleted or recreated, nil
// when the watch fails (transient), ctx.Err() never (the caller checks).
func awaitLoss(ctx context.Context, wch clientv3.WatchChan, t election.Ticket) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return nil
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete || uint64(ev.Kv.CreateRevision) != t.Token {
					return errOwnGone
				}
			}
		}
	}
}

// ownWatch is a watch on a candidate's own entry. It lives with the
// session, not with the call that made it, so that WaitHead can hand it to
// WatchLoss.
type ownWatch struct {
	name   string
	token  uint64
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

func (s *session) watchOwn(t election.Ticket) *ownWatch {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
	return &ownWatch{name: t.Name, token: t.Token, ch: s.cli.Watch(ctx, t.Name, clientv3.WithCreatedNotify()), cancel: cancel}
}

// handOver parks w for the WatchLoss of the same ticket, replacing (and
// cancelling) any watch parked before.
func (s *session) handOver(w *ownWatch) {
	s.ownMu.Lock()
	old := s.parked
	s.parked = w
	s.ownMu.Unlock()
	if old != nil {
		old.cancel()
	}
}

// takeOver returns the watch parked for t, if any; a watch parked for
// another ticket is cancelled.
func (s *session) takeOver(t election.Ticket) *ownWatch {
	s.ownMu.Lock()
	w := s.parked
	s.parked = nil
	s.ownMu.Unlock()
	if w != nil && (w.name != t.Name || w.token != t.Token) {
		w.cancel()
		return nil
	}
	return w
}

// Dequeue deletes t's entry if its create revision is still t's.
func (s *session) Dequeue(ctx context.Context, t election.Ticket) error {
	if w := s.takeOver(t); w != nil {
		w.cancel() // the entry goes; nobody will watch it
	}
	_, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(t.Name), "=", int64(t.Token))).
		Then(clientv3.OpDelete(t.Name)).
		Commit()
	return translate("dequeue", err)
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
