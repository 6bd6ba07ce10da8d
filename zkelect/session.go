package zkelect

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// OpenSession ties a session to the connection's current ZooKeeper session
// and confirms it with a sync every opts.RenewInterval, or every TTL/8 if
// that is sooner while the connection is not known to reach a single
// server (see anchor.go). It refuses a DeadlineMargin above 3/8 of the TTL
// (CheckDeadlineMargin).
func (b *Backend) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	if err := b.CheckTTL(opts.TTL); err != nil {
		return nil, err
	}
	if opts.RenewInterval <= 0 || opts.RenewInterval >= opts.TTL {
		return nil, fmt.Errorf("%w: zookeeper: RenewInterval %v must be positive and below the TTL %v", tenure.ErrInvalidConfig, opts.RenewInterval, opts.TTL)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := CheckDeadlineMargin(opts.TTL, opts.DeadlineMargin); err != nil {
		return nil, err
	}
	id, err := b.awaitSession(ctx)
	if err != nil {
		return nil, translate("session", err)
	}
	s := &session{b: b, id: id, opts: opts, loopDone: make(chan struct{}), closed: make(chan struct{}), nodes: map[string]uint64{}, parked: map[string]<-chan zk.Event{}, prefetched: map[string][]string{}, predicted: map[string]contender{}, keys: map[string]keyState{}, unsure: map[string]string{}, heads: map[string]int32{}}
	s.Init()
	s.ctx, s.stop = context.WithCancel(context.Background())
	var g election.Renewal
	if err := retry(ctx, func() (err error) {
		g, err = s.confirm(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	// On a connection to an ensemble that no session has confirmed lately,
	// the renewal counts from long ago (Backend.anchor): confirm again once
	// the first sync is old enough to count from, so that the lease starts
	// with as much time left as after any renewal.
	if stale := opts.Now().Sub(g.Sent); stale > opts.TTL/4+2*s.confirmEvery() {
		wait := time.NewTimer(opts.TTL / 4)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return nil, ctx.Err()
		}
		if err := retry(ctx, func() (err error) {
			g, err = s.confirm(ctx)
			return err
		}); err != nil {
			return nil, err
		}
	}
	s.granted = g
	if err := b.register(s); err != nil {
		return nil, err
	}
	go s.keepAlive()
	return s, nil
}

// register makes b track s: its expiry (expireStale) and Close. It refuses
// s when b is closed, and ends it (tenure.ErrSessionExpired) when the
// connection's ZooKeeper session is no longer s's: an expiry reported
// after s's last confirm but before s was tracked would otherwise be
// noticed only at its next confirm, a renewal interval later. On success
// the caller must start s.keepAlive, which b.wg now counts.
func (b *Backend) register(s *session) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return tenure.ErrClosed
	}
	// Under b.mu: expireStale reads the session id before it takes b.mu,
	// so a change after this check finds s in b.sessions.
	if !s.alive() {
		b.mu.Unlock()
		return s.expired(errors.New("replaced while the session was opening"))
	}
	b.sessions[s] = struct{}{}
	b.wg.Add(1) // under b.mu: a Close that ends s then waits for its keepAlive
	b.mu.Unlock()
	return nil
}

// MaxDeadlineMargin returns the largest DeadlineMargin a session with the
// given TTL may use: 3/8 of the TTL. On an ensemble a renewal counts from a
// sync up to 3/8 of the TTL old (see OpenSession), and a larger margin
// would leave no room for one failed renewal. The limit holds on a single
// server too, so that a configuration that works there works on an
// ensemble.
func MaxDeadlineMargin(ttl time.Duration) time.Duration { return ttl * 3 / 8 }

// CheckDeadlineMargin refuses a margin above MaxDeadlineMargin(ttl) with an
// error wrapping tenure.ErrInvalidConfig.
func CheckDeadlineMargin(ttl, margin time.Duration) error {
	if margin > MaxDeadlineMargin(ttl) {
		return fmt.Errorf("%w: zookeeper: DeadlineMargin %v must be at most 3/8 of the TTL %v (%v): on an ensemble a renewal counts from a sync a quarter of the TTL old", tenure.ErrInvalidConfig, margin, ttl, MaxDeadlineMargin(ttl))
	}
	return nil
}

// session is one elector's view of the connection's ZooKeeper session: it
// ends when that ZooKeeper session does, even if go-zookeeper opens a new
// one.
type session struct {
	b       *Backend
	id      int64
	opts    election.SessionOptions
	granted election.Renewal
	election.SessionSignals

	ctx       context.Context // ends at Close
	stop      context.CancelFunc
	loopDone  chan struct{}
	closed    chan struct{} // closed when Close has returned
	closeOnce sync.Once

	mu     sync.Mutex
	nodes  map[string]uint64          // path → czxid of the nodes this session created and holds
	parked map[string]<-chan zk.Event // path → a watch on that node, handed from call to call

	prefetched map[string][]string  // node path → its key's children, read just after it was created
	predicted  map[string]contender // node path → the contender right before it, known without a read (predict)
	keys       map[string]keyState  // key → what predict knows of its queue
	unsure     map[string]string    // node path → its guid, when a create of that guid lost its reply
	heads      map[string]int32     // node path → the key node's data version, for a head whose release records the handover (markHead)
}

func (s *session) Granted() election.Renewal { return s.granted }

// end ends the session and stops the Backend's tracking of it.
func (s *session) end(err error) {
	if s.End(err) {
		s.b.mu.Lock()
		delete(s.b.sessions, s)
		s.b.mu.Unlock()
	}
}

func (s *session) expired(cause error) error {
	err := fmt.Errorf("%w: zookeeper session %#x: %w", tenure.ErrSessionExpired, s.id, cause)
	s.end(err)
	return err
}

// alive reports whether the connection still runs this session's
// ZooKeeper session.
func (s *session) alive() bool { return s.b.sessionID.Load() == s.id }

// confirm sends one sync and, when it is answered on this session's
// ZooKeeper session, returns the renewal it proves: counted from the
// sync's sending on a single server, from an older sync's on an ensemble
// (Backend.anchor).
//
// A sync, unlike a read, is answered only after it has gone through the
// ensemble's leader server, which is the one that expires sessions. A
// follower that has lost its leader answers reads from its own copy for up
// to syncLimit × tickTime before it drops its clients, while the leader
// server counts the session down: a read it answers proves nothing about
// the session there. Its syncs go unanswered.
func (s *session) confirm(ctx context.Context) (election.Renewal, error) {
	if !s.alive() {
		return election.Renewal{}, s.expired(errors.New("replaced"))
	}
	probe := "/"
	s.mu.Lock()
	for p := range s.nodes {
		probe = p
		break
	}
	s.mu.Unlock()
	c := s.b.tap.cur.Load()
	sent, sentWall := s.opts.Now(), time.Now()
	_, err := call(ctx, s.b, func() (string, error) { return s.b.conn.Sync(probe) }, nil)
	if err != nil {
		if errors.Is(err, zk.ErrSessionExpired) || !s.alive() {
			return election.Renewal{}, s.expired(err)
		}
		return election.Renewal{}, translate("sync "+probe, err)
	}
	if !s.alive() {
		return election.Renewal{}, s.expired(errors.New("replaced while renewing"))
	}
	at, ok := s.b.anchor(c, sentWall, time.Now())
	if !ok {
		return election.Renewal{}, fmt.Errorf("%w: zookeeper: reconnected while renewing", tenure.ErrUnavailable)
	}
	// The session timeout the server granted on this connection, but never
	// more than the one Dial asked for and checked: a server reached after
	// a reconnection may grant a longer one (its min/maxSessionTimeout),
	// while the ensemble's leader server may still count the session down
	// with the one it had.
	ttl := min(time.Duration(s.b.negotiatedMs.Load())*time.Millisecond, s.b.timeout)
	// On the elector's clock: as long before sent as at was before sentWall.
	return election.Renewal{Sent: sent.Add(-sentWall.Sub(at)), TTL: ttl}, nil
}

// confirmEvery is how often a session confirms itself: every
// RenewInterval, and at least eight times per session timeout while the
// connection may reach an ensemble, so that a renewal counted from a sync a
// quarter of the timeout old (Backend.anchor) still leaves room for a few
// failed ones.
func (s *session) confirmEvery() time.Duration {
	if s.b.strictAnchor() {
		return min(s.opts.RenewInterval, s.opts.TTL/8)
	}
	return s.opts.RenewInterval
}

// keepAlive confirms the session every confirmEvery (four times as often
// after a failure).
func (s *session) keepAlive() {
	defer s.b.wg.Done()
	defer close(s.loopDone)
	every := s.confirmEvery()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.Done():
			return
		case <-t.C:
		}
		// A slow sync may still come back in time to count: wait for it
		// for RenewInterval, not just until the next one is due.
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.RenewInterval)
		r, err := s.confirm(ctx)
		every = s.confirmEvery()
		cancel()
		switch {
		case s.ctx.Err() != nil:
			return
		case errors.Is(err, tenure.ErrSessionExpired):
			return
		case err != nil:
			s.Push(election.Renewal{Err: err})
			t.Reset(every / 4)
			continue
		}
		s.Push(r)
		t.Reset(every)
	}
}

// Close stops the renewals and deletes the nodes this session holds. The
// ZooKeeper session itself belongs to the Backend. Nodes it cannot delete
// now are deleted in the background while the ZooKeeper session lives (an
// orphan at the head of a queue would block it for good).
func (s *session) Close(ctx context.Context) error {
	s.stop()
	<-s.loopDone
	defer s.closeOnce.Do(func() { close(s.closed) })
	defer s.end(tenure.ErrClosed)
	s.mu.Lock()
	left := make(map[string]uint64, len(s.nodes))
	for p, z := range s.nodes {
		left[p] = z
	}
	s.mu.Unlock()
	var errs []error
	for p, z := range left {
		if err := s.Dequeue(ctx, election.Ticket{Name: p, Token: z}); err != nil {
			errs = append(errs, err)
			s.b.reap(s.id, p, z)
			s.forget(p) // and the other nodes of its guid, if any
		}
	}
	return errors.Join(errs...)
}

// reapAny, as the session of reap, deletes the node whichever session owns
// it, without looking at the owner: for a node whose name holds the guid
// of one of this connection's Enqueues (122 random bits: no other client
// makes that name), created under whichever session the connection had
// when its create was sent.
const reapAny int64 = 0

// reap deletes the node p in the background until it is gone, the
// ZooKeeper session id ends (the node goes with it), or the Backend
// closes. With id reapAny, only the first and the last end it.
//
// Each try first deletes p at version 0 (tenure never changes its nodes,
// and a name is never reused: such a node is the one made as p), one
// request that takes effect even when its reply is lost: on a link whose
// round trip outlasts go-zookeeper's connections (it gives one up after
// two thirds of the session timeout without a reply), a read first never
// comes back, while each reconnection keeps the session, and so the node,
// alive. A node at another version, or a delete refused, is handled after
// a read shows the node is the one p named (deleteOwned).
func (b *Backend) reap(id int64, p string, z uint64) {
	b.reapLoop(id, func() bool {
		err := b.conn.Delete(p, 0)
		switch {
		case err == nil, errors.Is(err, zk.ErrNoNode):
			return true
		case errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrNoServer), errors.Is(err, zk.ErrClosing):
			return false // try again on the next connection
		}
		// Another version, or refused (deleteOwned gives up a delete the
		// key's ACL refuses, with a warning): read it first.
		return b.deleteOwned(id, p, z)
	})
}

// reapGUID deletes, in the background, every node under key created with
// guid (by a create whose outcome is unknown: its reply was lost, or its
// caller gave up), whichever of the connection's sessions owns it, until
// one read of the queue shows none left or the Backend closes. The read
// follows a sync, as findByGUID's does.
func (b *Backend) reapGUID(key, guid string) {
	b.reapLoop(reapAny, func() bool {
		children, err := b.syncedChildren(key)
		if errors.Is(err, zk.ErrNoNode) {
			return true
		}
		if err != nil {
			return false
		}
		clean := true
		for _, c := range children {
			if guidOf(c) == guid && !b.deleteOwned(reapAny, path.Join(key, c), 0) {
				clean = false
			}
		}
		return clean
	})
}

// syncedChildren reads key's children after a sync, so that the server the
// connection now uses has applied every write the ensemble's leader had
// committed when the sync reached it (a create whose reply was lost
// included, if it was committed by then).
func (b *Backend) syncedChildren(key string) ([]string, error) {
	if _, err := b.conn.Sync(key); err != nil {
		return nil, err
	}
	c, _, err := b.conn.Children(key)
	return c, err
}

// deleteOwned deletes p if session id owns it (any session with reapAny)
// and, when z is not 0, its czxid is z (a name is never reused, but a node
// found by name alone could be another session's). done is false when the
// link failed: try again. A delete the key's ACL refuses is given up
// (logged): trying again would not help, and the node goes with its
// session.
func (b *Backend) deleteOwned(id int64, p string, z uint64) (done bool) {
	ok, st, err := b.conn.Exists(p)
	if err != nil {
		return false
	}
	if !ok || id != reapAny && st.EphemeralOwner != id || z != 0 && uint64(st.Czxid) != z {
		return true
	}
	err = b.conn.Delete(p, st.Version)
	if errors.Is(err, zk.ErrNoAuth) {
		b.log.Warn("zookeeper: cannot delete a node this connection made; it goes when its session ends",
			zap.String("node", p), zap.Int64("session", st.EphemeralOwner), zap.Error(err))
		return true
	}
	return err == nil || errors.Is(err, zk.ErrNoNode)
}

// reapLoop runs try until it reports done, the ZooKeeper session id ends
// (never with reapAny) or the Backend closes, again after every change of
// connection state or half a second.
func (b *Backend) reapLoop(id int64, try func() (done bool)) {
	b.spawn(func() {
		for {
			b.mu.Lock()
			closed, ch := b.closed, b.changed
			b.mu.Unlock()
			if closed || id != reapAny && b.sessionID.Load() != id || try() {
				return
			}
			select {
			case <-ch:
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
}

// spawn runs f in a goroutine Close waits for, unless the Backend is
// closed (then not at all). The check and the count are made under b.mu,
// so that no count is added once Close waits.
func (b *Backend) spawn(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}
