package redislock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// session is a client-side session: the entries one candidate has, and the
// watchdog that extends the held ones.
type session struct {
	election.SessionSignals
	b       *Backend
	id      string // names the session's channels and waiting entries
	ttl     time.Duration
	every   time.Duration
	now     func() time.Time
	granted election.Renewal

	mu      sync.Mutex
	entries map[string]*entry        // by random part (Ticket.Name)
	subs    map[string]*subscription // by key, kept for later campaigns
	closed  bool

	stop      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
}

// entry is one candidate's claim on a key. Ticket.Name is its random part.
type entry struct {
	t election.Ticket

	mu      sync.Mutex // serializes acquire and release
	held    bool
	removed bool
	token   uint64
	heldCh  chan struct{} // closed when acquired
	lost    chan struct{} // closed when the lock is found gone or taken
	lostErr error
	waiting bool          // registered in "<key>:waiting" by a failed try
	unsure  bool          // a try's reply was lost: it may land later
	kick    chan struct{} // the registration lapsed: try again (and register)
}

func (s *session) Granted() election.Renewal { return s.granted }

func (s *session) entry(t election.Ticket) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.entries[t.Name]
}

func (s *session) alive() error {
	if err := s.Err(); err != nil {
		return err
	}
	return nil
}

// Enqueue implements election.Session. Redis has no queue: the entry exists
// only in this process until WaitHead or Ahead acquires the key. The token
// is issued at acquisition (see election.Session.WaitHead). An entry the
// session already has for key is returned; when it still holds the key
// (its term ended without a release), with the token it drew, as the
// elector expects of an entry an earlier term left behind: it deletes it
// and campaigns with a new entry and a larger token.
func (s *session) Enqueue(ctx context.Context, key, identity string) (election.Ticket, error) {
	if err := CheckKey(key); err != nil {
		return election.Ticket{}, err
	}
	if err := ctx.Err(); err != nil {
		return election.Ticket{}, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return election.Ticket{}, tenure.ErrClosed
	}
	for _, e := range s.entries {
		if e.t.Key == key {
			s.mu.Unlock()
			e.mu.Lock() // with s.mu released: Dequeue and extend take e.mu, then s.mu
			defer e.mu.Unlock()
			t := e.t
			if e.held {
				t.Token = e.token
			}
			return t, nil
		}
	}
	defer s.mu.Unlock()
	e := &entry{
		t:      election.Ticket{Key: key, Identity: identity, Name: newRandom()},
		heldCh: make(chan struct{}),
		lost:   make(chan struct{}),
		kick:   make(chan struct{}, 1),
	}
	s.entries[e.t.Name] = e
	return e.t, nil
}

// granted reports whether an acquire script's reply took the key.
func granted(r reply) bool {
	if r.err != nil {
		return false
	}
	v, ok := r.val.([]any)
	if !ok || len(v) != 2 {
		return false
	}
	n, _ := v[0].(int64)
	return n == 1
}

// acquire tries once to take e's key on a quorum of masters within the
// validity time. It returns whether e holds, and otherwise how long the
// current holder's key still lives (0 when unknown) and whether the try
// took the key on some masters but not a quorum (a split vote, when others
// tried at the same moment; or a holder that has the others, with a master
// that lost the key; or a try that came too late).
func (s *session) acquire(ctx context.Context, e *entry) (held bool, wait time.Duration, split bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.removed {
		return false, 0, false, fmt.Errorf("%w: redislock: entry on %q was removed", tenure.ErrOwnershipLost, e.t.Key)
	}
	if e.held {
		return true, 0, false, nil
	}
	if err := ctx.Err(); err != nil {
		// fanOut's calls do not end with ctx: a try sent now would take
		// the key for nobody until the campaign's clean-up.
		return false, 0, false, err
	}
	b := s.b
	start := s.now()
	ttlMs := strconv.FormatInt(s.ttl.Milliseconds(), 10)
	late := func(r reply) { s.lateGrant(e, r) }
	rs := b.fanOut(ctx, b.masterTimeout(s.ttl), granted, late, func(ctx context.Context, c *redis.Client) (any, error) {
		return acquireScript.Run(ctx, c, []string{e.t.Key, e.t.Key + fenceSuffix, e.t.Key + waitingSuffix, s.tombstone(e)},
			e.t.Name, e.t.Identity, ttlMs, b.channel(e.t.Key), s.member(e)).Slice()
	})
	elapsed := s.now().Sub(start)
	got, answered, refused := 0, 0, 0
	var token uint64
	var grants []uint64 // the tokens of the masters that granted
	for _, r := range rs {
		if r.err != nil {
			// The script may have run, or may still run: its clean-up
			// must leave a tombstone.
			e.unsure = true
			continue
		}
		answered++
		v := r.val.([]any)
		if len(v) != 2 {
			continue
		}
		if n, _ := v[0].(int64); n == -1 {
			refused++ // e's tombstone: its campaign ended
		} else if n == 1 {
			got++
			tok, err := strconv.ParseUint(fmt.Sprint(v[1]), 10, 64)
			if err == nil && tok > token {
				token = tok
			}
			grants = append(grants, tok)
		} else if pttl, ok := v[1].(int64); ok && pttl > 0 {
			if d := time.Duration(pttl) * time.Millisecond; wait == 0 || d < wait {
				wait = d
			}
		}
	}
	if refused > 0 {
		// Only a removed entry has a tombstone, and a removed entry is
		// refused above: this is a session bug, not a state to wait in.
		return false, 0, false, fmt.Errorf("%w: redislock: entry on %q found its own tombstone", tenure.ErrOwnershipLost, e.t.Key)
	}
	won := got >= b.quorum() && token > 0 && s.ttl-elapsed-b.drift(s.ttl) > 0
	if won && s.countersReach(ctx, e, grants, token) {
		// The validity time counts what countersReach took too.
		won = s.ttl-s.now().Sub(start)-b.drift(s.ttl) > 0
	} else {
		won = false // too late, or a quorum of counters below the token: undone below
	}
	if won {
		e.held, e.token = true, token
		close(e.heldCh)
		return true, 0, false, nil
	}
	if got > 0 {
		// A minority, or too late: undo it everywhere, as Redlock does,
		// but keep the waiting entries this try made, so that the
		// holder's release on those masters still wakes e.
		s.releaseLocked(context.WithoutCancel(ctx), e, keepWaiting)
	}
	if answered < b.quorum() {
		if ctx.Err() != nil {
			return false, 0, got > 0, ctx.Err()
		}
		return false, 0, got > 0, b.quorumErr("acquire "+e.t.Key, rs, answered)
	}
	e.waiting = got < answered
	return false, wait, got > 0, nil
}

// countersReach makes sure that a quorum of the masters' token counters
// are at token or above before e's term begins, and reports whether they
// are. Each master counts its own: a try that took a minority and was
// undone still moved the counters of the masters it took, and a quorum
// that includes one of them draws its larger count as the token. Unless a
// quorum of counters is raised to it, a later holder whose quorum misses
// that master draws a smaller token than this one (with no data lost and
// no failover). Every later quorum shares a master with a quorum at token
// or above, and its INCR there passes the token. Usually the granting
// masters drew the same count, a quorum, and nothing is sent.
func (s *session) countersReach(ctx context.Context, e *entry, grants []uint64, token uint64) bool {
	b := s.b
	at := 0
	for _, g := range grants {
		if g == token {
			at++
		}
	}
	if at >= b.quorum() {
		return true
	}
	tok := strconv.FormatUint(token, 10)
	rs := b.fanOut(ctx, b.masterTimeout(s.ttl), func(r reply) bool { return r.err == nil }, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		return raiseScript.Run(ctx, c, []string{e.t.Key + fenceSuffix}, tok).Int64()
	})
	at = 0
	for _, r := range rs {
		if r.err == nil {
			at++
		}
	}
	return at >= b.quorum()
}

// lateGrant handles the reply of a try that came after acquire stopped
// waiting for it (a quorum had granted the try). Each master counts its
// own tokens: a master that granted late holds e's key under its own
// count, which Leader, reading every master, would report when it is the
// largest. While e holds, that master's value is rewritten at once to
// carry e's token, the one its term has. (The watchdog's next extension
// does the same on every master, for a late grant whose reply was lost;
// a grant that came too late for a try that did not win is the
// campaign's clean-up's: e.unsure.)
func (s *session) lateGrant(e *entry, r reply) {
	if !granted(r) {
		return
	}
	tok, err := strconv.ParseUint(fmt.Sprint(r.val.([]any)[1]), 10, 64)
	if err != nil {
		return
	}
	e.mu.Lock()
	held, want := e.held && !e.removed, e.token
	e.mu.Unlock()
	if !held || tok == want {
		return
	}
	// Not under e.mu: the master is a slow one, and the watchdog must not
	// wait for it. The script changes only this exact value: a release or
	// a later grant meanwhile leaves it alone.
	ctx, cancel := context.WithTimeout(context.Background(), s.b.masterTimeout(s.ttl))
	defer cancel()
	_ = retokenScript.Run(ctx, s.b.masters[r.i], []string{e.t.Key}, s.value(e, tok), s.value(e, want)).Err()
}

// value is the lock value of e under token tok, as acquireScript writes it.
func (s *session) value(e *entry, tok uint64) string {
	return e.t.Name + " " + strconv.FormatUint(tok, 10) + " " + e.t.Identity
}

// releaseMode says what a release does besides deleting the key.
type releaseMode int

const (
	// finalRelease ends e's campaign: its waiting entry goes, and, when a
	// try's reply was lost, a tombstone keeps that try from acting later.
	finalRelease releaseMode = iota
	// keepWaiting undoes a try that took a minority of the masters; e
	// goes on waiting.
	keepWaiting
)

// tombstone names e's tombstone key.
func (s *session) tombstone(e *entry) string { return e.t.Key + goneInfix + e.t.Name }

// tombstoneTTL is how long a tombstone stands: longer than any try can
// sensibly stay on its way (the client gave up on it after its read
// timeout), and never shorter than a minute.
func (s *session) tombstoneTTL() time.Duration { return max(2*s.ttl, time.Minute) }

// releaseLocked deletes e's key on every master where it is e's. It
// returns an error when fewer than a quorum answered. e.mu must be held.
func (s *session) releaseLocked(ctx context.Context, e *entry, mode releaseMode) error {
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, s.ttl)
	defer cancel()
	tomb, keep := "0", "0"
	switch {
	case mode == keepWaiting:
		keep = "1"
	case e.unsure:
		tomb = strconv.FormatInt(s.tombstoneTTL().Milliseconds(), 10)
	}
	rs := b.fanOut(ctx, b.masterTimeout(s.ttl), func(r reply) bool { return r.err == nil }, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		return releaseScript.Run(ctx, c, []string{e.t.Key, e.t.Key + waitingSuffix, s.tombstone(e)},
			e.t.Name, b.channel(e.t.Key), s.member(e), tomb, keep).Int64()
	})
	answered := 0
	for _, r := range rs {
		if r.err == nil {
			answered++
		}
	}
	if answered < b.quorum() {
		return b.quorumErr("release "+e.t.Key, rs, answered)
	}
	e.held = false
	if mode != keepWaiting {
		e.waiting = false
	}
	return nil
}

// Ahead implements election.Session. Redis keeps no queue, so this tries
// to take the key at once: 0 when t now holds, 1 when someone else does.
// That makes TryCampaign atomic: of several candidates that try at the same
// moment, one gets the key and the others are told it is held. With
// several masters, candidates that try at the same moment can split the
// masters between them, none with a quorum: such a try is undone and made
// again after a random pause (up to splitTries times), so that one of them
// takes the key rather than none.
func (s *session) Ahead(ctx context.Context, t election.Ticket) (int, error) {
	e := s.entry(t)
	if e == nil {
		return 0, fmt.Errorf("%w: redislock: no entry %s on %q", tenure.ErrOwnershipLost, t.Name, t.Key)
	}
	for try := 1; ; try++ {
		ok, _, split, err := s.acquire(ctx, e)
		switch {
		case err != nil:
			return 0, err
		case ok:
			return 0, nil
		case !split || try == splitTries:
			return 1, nil
		}
		// Some masters, no quorum. A holder that has a quorum (one master
		// lost the key) is no split vote: trying again would only churn
		// that master.
		l, err := s.b.Leader(ctx, t.Key)
		if err != nil {
			return 0, err // not "held": the key may be vacant
		}
		if !l.Vacant {
			return 1, nil
		}
		// A split vote: candidates that tried at the same moment each took
		// some masters and none a quorum, and each undid its share. Told
		// "held", every one of them would skip, and nobody would hold.
		// Try again after a random pause, as Redlock does: the first to
		// wake takes the key, and the others find it held.
		t := time.NewTimer(time.Duration(mrand.Int64N(int64(splitPause))))
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		case <-t.C:
		}
	}
}

// splitTries bounds the tries of Ahead after split votes, and splitPause
// the random pause between them: well above a try's round trip to distant
// masters, so that the first to wake is done before the next one starts.
const (
	splitTries = 8
	splitPause = 100 * time.Millisecond
)

// WaitHead implements election.Session: it tries to take the key, and
// while someone else holds it, waits until a release names it (a release
// wakes the waiter the server heard from least recently, not all of them),
// or the holder's key expires, and tries again. A waiter that is never named
// (its message lost, or the named waiter died on the way) tries when the
// holder's key would expire, at most a TTL later. Transient failures are
// retried every 50 ms until ctx ends. It returns t with the token the
// acquisition drew.
func (s *session) WaitHead(ctx context.Context, t election.Ticket) (election.Ticket, error) {
	e := s.entry(t)
	if e == nil {
		return t, fmt.Errorf("%w: redislock: no entry %s on %q", tenure.ErrOwnershipLost, t.Name, t.Key)
	}
	var sub *subscription
	var wake <-chan struct{}
	for {
		if err := s.alive(); err != nil {
			return t, err
		}
		ok, wait, split, err := s.acquire(ctx, e)
		if ok {
			t.Token = e.token
			return t, nil
		}
		if errors.Is(err, tenure.ErrOwnershipLost) || errors.Is(err, tenure.ErrInvalidConfig) || errors.Is(err, tenure.ErrClosed) {
			return t, err // gone, refused (credentials, ACL) or closed clients: waiting will not help
		}
		if ctx.Err() != nil {
			return t, ctx.Err()
		}
		if err == nil && split {
			// A holder that has a quorum, with a master that lost its key,
			// is no split vote (as in Ahead): wait for it as for any
			// holder, not by trying again every splitPause for its whole
			// term.
			if l, lerr := s.b.Leader(ctx, t.Key); lerr == nil && !l.Vacant {
				split = false
			}
		}
		if err != nil {
			wait = retryPause
		} else if sub == nil {
			// Subscribe, then try again at once: a release between the
			// failed try and the subscription is not missed.
			if sub, err = s.subscription(ctx, t.Key); err != nil {
				sub = nil
				wait = retryPause
			} else {
				sub.want.Store(&t.Name)
				defer sub.want.Store(nil)
				wake = sub.ch
				if !split {
					continue
				}
			}
		}
		pause := err == nil && split
		switch {
		case pause:
			// A split vote: candidates that tried at the same moment each
			// took some masters, none a quorum, and undid their share,
			// which wakes the others. Tried again at once, the masters
			// split the same way again (with one of three down, for as
			// long as it is down). Try again after a random pause, as
			// Redlock does, and let no wake-up cut it short: the first to
			// wake takes the key.
			wait = time.Duration(mrand.Int64N(int64(splitPause)))
		case wait > 0 && wait < s.ttl:
			wait += time.Millisecond // the key is gone by then
		case wait <= 0:
			wait = s.b.opts.PollInterval // held without an expiry (not tenure's), or no answer
		default:
			wait = s.ttl
		}
		woken, kicked := wake, e.kick
		if pause {
			woken, kicked = nil, nil
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return t, ctx.Err()
		case <-s.Done():
			timer.Stop()
			return t, s.Err()
		case <-e.heldCh: // Ahead took it meanwhile
		case <-kicked:
		case <-woken:
		case <-timer.C:
		}
		if pause {
			select {
			case <-wake: // the undo's, or a release's: the try below sees it
			default:
			}
		}
		timer.Stop()
	}
}

// member names e in "<key>:waiting": the session, whose channel a release
// publishes on, and e's random part, which the message carries.
func (s *session) member(e *entry) string { return s.id + " " + e.t.Name }

// subscription returns the session's subscription to its channel for key,
// subscribing on first use: a candidate that campaigns again reuses it
// instead of opening a connection per campaign. A wake-up left over from
// an earlier campaign costs one extra try.
func (s *session) subscription(ctx context.Context, key string) (*subscription, error) {
	s.mu.Lock()
	if sub := s.subs[key]; sub != nil || s.closed {
		s.mu.Unlock()
		if sub == nil {
			return nil, tenure.ErrClosed
		}
		return sub, nil
	}
	s.mu.Unlock()
	sub, err := s.b.subscribe(ctx, s.b.masterTimeout(s.ttl), s.b.channel(key)+":"+s.id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.subs[key]; old != nil || s.closed { // raced with another campaign, or Close
		go sub.close()
		if old == nil {
			return nil, tenure.ErrClosed
		}
		return old, nil
	}
	s.subs[key] = sub
	return sub, nil
}

// retryPause is the pause after a transient failure while waiting; the
// elector's lease deadline bounds how long a waiter keeps retrying.
const retryPause = 50 * time.Millisecond

// WatchLoss implements election.Session: it returns when the watchdog found
// t's key gone or someone else's (tenure.ErrOwnershipLost), when the
// session ends, or when ctx does.
func (s *session) WatchLoss(ctx context.Context, t election.Ticket) error {
	e := s.entry(t)
	if e == nil {
		return fmt.Errorf("%w: redislock: no entry %s on %q", tenure.ErrOwnershipLost, t.Name, t.Key)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-s.Done():
		return s.Err()
	case <-e.lost:
		return e.lostErr
	}
}

// Dequeue implements election.Session: compare-and-delete on every master,
// so a key that expired and was taken by someone else is left alone.
func (s *session) Dequeue(ctx context.Context, t election.Ticket) error {
	e := s.entry(t)
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removed = true
	if err := s.releaseLocked(ctx, e, finalRelease); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.entries, t.Name)
	s.mu.Unlock()
	return nil
}

// watchdog extends every held key, and renews every waiting entry, every
// s.every, and reports each round as a renewal: the deadline moves only
// when every one was renewed on a quorum of masters.
func (s *session) watchdog() {
	defer close(s.stopped)
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		s.Push(s.renew())
	}
}

// renew runs one watchdog round.
func (s *session) renew() election.Renewal {
	ctx, cancel := context.WithTimeout(context.Background(), s.every)
	defer cancel()
	sent := s.now()
	s.mu.Lock()
	var es []*entry
	for _, e := range s.entries {
		es = append(es, e)
	}
	s.mu.Unlock()
	var errs []error
	extended := 0
	for _, e := range es {
		switch err := s.extend(ctx, e); {
		case err == nil:
			extended++
		case !errors.Is(err, errNotHeld):
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return election.Renewal{Sent: sent, Err: errors.Join(errs...)}
	}
	if extended == 0 {
		// Nothing to extend: check that the masters are there.
		if _, err := s.b.pingQuorum(ctx, s.b.masterTimeout(s.ttl)); err != nil {
			return election.Renewal{Sent: sent, Err: err}
		}
	}
	return election.Renewal{Sent: sent, TTL: s.ttl - s.b.drift(s.ttl)}
}

// errNotHeld: the entry has nothing to extend (not tried yet).
var errNotHeld = errors.New("redislock: not held")

// stillWaitingLocked renews e's waiting entry on every master; when no master
// has it any more (it lapsed: the server did not hear from e for a TTL),
// the waiter is kicked to try again, which registers it anew. e.mu must
// be held.
func (s *session) stillWaitingLocked(ctx context.Context, e *entry) error {
	b := s.b
	ttlMs := strconv.FormatInt(s.ttl.Milliseconds(), 10)
	rs := b.fanOut(ctx, b.masterTimeout(s.ttl), nil, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		return stillWaitingScript.Run(ctx, c, []string{e.t.Key + waitingSuffix}, s.member(e), ttlMs).Int64()
	})
	answered, renewed := 0, 0
	for _, r := range rs {
		if r.err == nil {
			answered++
			if r.val.(int64) > 0 {
				renewed++
			}
		}
	}
	if answered < b.quorum() {
		return b.quorumErr("renew waiting "+e.t.Key, rs, answered)
	}
	if renewed == 0 {
		e.waiting = false
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// extend runs compare-and-pexpire for e on every master, or renews e's
// waiting entry while e waits. A key that a quorum no longer has as e's is
// lost: e's term ends.
func (s *session) extend(ctx context.Context, e *entry) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.removed {
		return errNotHeld
	}
	if !e.held {
		if e.waiting {
			return s.stillWaitingLocked(ctx, e)
		}
		return errNotHeld
	}
	b := s.b
	ttlMs := strconv.FormatInt(s.ttl.Milliseconds(), 10)
	rs := b.fanOut(ctx, b.masterTimeout(s.ttl), func(r reply) bool { return r.err == nil && r.val.(int64) == 1 }, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		return extendScript.Run(ctx, c, []string{e.t.Key}, e.t.Name, ttlMs, s.value(e, e.token)).Int64()
	})
	ok, notOurs := 0, 0
	for _, r := range rs {
		switch {
		case r.err != nil:
		case r.val.(int64) == 1:
			ok++
		default:
			notOurs++
		}
	}
	if ok >= b.quorum() {
		return nil
	}
	if notOurs > len(b.masters)-b.quorum() {
		// A quorum is impossible: the key expired, and maybe another holds.
		err := fmt.Errorf("%w: redislock: %q is no longer this holder's on %d of %d masters (it expired before the watchdog extended it, was deleted, or went with a restart)",
			tenure.ErrOwnershipLost, e.t.Key, notOurs, len(b.masters))
		// The entry is spent: it leaves the session before its loss is
		// told (close(e.lost) wakes WatchLoss, and the elector campaigns
		// again at once), so that the next campaign gets a new entry; a
		// campaign that still holds this one fails (acquire) instead of
		// taking the key again. Dequeue of the lost ticket then finds
		// nothing, so the release is made here, after the loss is told:
		// compare-and-delete on every master, unless every one answered
		// that the key is not e's. The masters that still had the key as
		// e's were just extended by this round (those that did not answer
		// in time may have been too), and would keep it a full TTL: with
		// 2 masters, or 3 with one down, nobody could take the lock
		// meanwhile. A try of e's whose reply was lost may still land:
		// the release leaves e's tombstone too (best effort).
		e.held, e.removed = false, true
		s.mu.Lock()
		if s.entries[e.t.Name] == e {
			delete(s.entries, e.t.Name)
		}
		s.mu.Unlock()
		e.lostErr = err
		close(e.lost)
		if notOurs < len(b.masters) || e.unsure {
			_ = s.releaseLocked(ctx, e, finalRelease)
		}
		return err
	}
	return b.quorumErr("extend "+e.t.Key, rs, ok+notOurs)
}

// Close implements election.Session: it stops the watchdog, releases every
// key the session holds (compare-and-delete, on ctx), removes its waiting
// entries and ends the session.
func (s *session) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.stopped
		s.mu.Lock()
		s.closed = true
		var es []*entry
		for _, e := range s.entries {
			es = append(es, e)
		}
		s.entries = map[string]*entry{}
		subs := s.subs
		s.subs = nil
		s.mu.Unlock()
		for _, sub := range subs {
			sub.close()
		}
		var errs []error
		for _, e := range es {
			e.mu.Lock()
			e.removed = true
			// The key, or the waiting entry; also when neither is known:
			// a try whose reply was lost may have registered it.
			errs = append(errs, s.releaseLocked(ctx, e, finalRelease))
			e.mu.Unlock()
		}
		s.End(tenure.ErrClosed)
		err = errors.Join(errs...)
	})
	return err
}
