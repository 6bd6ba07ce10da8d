package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/internal/isnil"
)

// Option injects a dependency into New. Options are applied once, by New;
// without any, an Elector logs nowhere, registers no metrics and uses the
// system clock.
type Option func(*Elector)

// WithLogger sets the logger. Default: zap.NewNop(). Every line carries the
// key and identity, and the term where one is known.
func WithLogger(l *zap.Logger) Option {
	return func(e *Elector) {
		if l != nil {
			e.log = l
		}
	}
}

// WithMetrics reports the elector's state and transitions on m (see
// Metrics). Default: no metrics. Two Electors on the same key and backend
// cannot share one Metrics.
func WithMetrics(m *Metrics) Option {
	return func(e *Elector) { e.rec.m = m }
}

// WithClock sets the clock read for lease deadlines. Default: the system
// clock (time.Now), also when c is nil (a nil pointer or func included).
func WithClock(c Clock) Option {
	return func(e *Elector) {
		if !isnil.Nil(c) {
			e.clock = c
		}
	}
}

// Elector campaigns for one key on one backend. Its methods are safe for
// concurrent use; campaigns are serialized (a second Campaign waits for the
// first, or for its own ctx to end). Close it when done: it owns a session
// and goroutines. Create it with New: the zero Elector is not usable.
type Elector struct {
	b     Backend
	cfg   Config
	log   *zap.Logger
	clock Clock
	rec   recorder

	campaignSem chan struct{} // one campaign at a time (capacity 1)
	runSem      chan struct{} // one Run at a time (capacity 1)

	mu           sync.Mutex
	lease        *lease // current session, nil until needed or after loss
	lead         *leadership
	pending      *Ticket // the entry of the campaign in progress
	pendingLease *lease
	closed       bool
	closeDone    chan struct{}  // closed when the first Close has finished
	wg           sync.WaitGroup // Observe goroutines and closings of lost sessions

	// The leaders whose arrival after a vacancy was recorded in
	// tenure_failover_seconds lately, so that each failover is recorded
	// once however many Observes of this elector saw it.
	failMu       sync.Mutex
	recorded     [16]leaderID
	nextRecorded int

	ctx       context.Context // ends at Close
	cancelAll context.CancelFunc
}

// leadership is one term held by this elector.
type leadership struct {
	term   tenure.Term
	ticket Ticket
	lease  *lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // the loss watcher exited
	work   chan struct{} // closed when Run's elected work has returned; nil outside Run

	// Run's term only: workDone closes when OnElected returns; hardStop
	// when OnHardStop begins; finish (once) closes work and drops the
	// lease hold.
	workDone     chan struct{}
	hardStop     chan struct{}
	hardStopDone chan struct{} // closed when OnHardStop has returned
	finishOnce   sync.Once

	released bool      // the entry was deleted (guarded by Elector.mu)
	ended    time.Time // when the term's context ended (guarded by Elector.mu)
}

// New returns an Elector for cfg.Key on b. It applies cfg's defaults,
// validates cfg and asks b to check the key and TTL; every error wraps
// tenure.ErrInvalidConfig. It does not contact the backend.
func New(b Backend, cfg Config, opts ...Option) (*Elector, error) {
	if isnil.Nil(b) {
		return nil, fmt.Errorf("%w: nil Backend", tenure.ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := b.CheckKey(cfg.Key); err != nil {
		return nil, err
	}
	if err := b.CheckTTL(cfg.TTL); err != nil {
		return nil, err
	}
	e := &Elector{b: b, cfg: cfg, log: zap.NewNop(), clock: realClock{},
		campaignSem: make(chan struct{}, 1), runSem: make(chan struct{}, 1), closeDone: make(chan struct{})}
	e.ctx, e.cancelAll = context.WithCancel(context.Background())
	for _, o := range opts {
		if o != nil { // a nil Option changes nothing
			o(e)
		}
	}
	e.log = e.log.With(zap.String("key", cfg.Key), zap.String("identity", cfg.Identity), zap.String("backend", b.Name()))
	e.rec.e, e.rec.key, e.rec.backend = e, cfg.Key, b.Name()
	if e.rec.m != nil {
		if !utf8.ValidString(b.Name()) { // a label value; Prometheus would panic
			return nil, fmt.Errorf("%w: metrics: the backend's name %q is not valid UTF-8", tenure.ErrInvalidConfig, b.Name())
		}
		if err := e.rec.m.add(e); err != nil {
			return nil, err
		}
		e.rec.init()
	}
	return e, nil
}

// Config returns the elector's configuration, defaults applied.
func (e *Elector) Config() Config { return e.cfg }

// currentLease returns a live lease, opening a session when there is none.
func (e *Elector) currentLease(ctx context.Context) (*lease, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, tenure.ErrClosed
	}
	if l := e.lease; l != nil && l.Valid() {
		e.mu.Unlock()
		return l, nil
	}
	old := e.lease
	e.lease = nil
	if old != nil {
		e.retireLeaseLocked(old)
	}
	// Close waits for the session being opened, and for its stop when
	// Close came meanwhile (stopLeaseLocked below, counted while this is).
	e.wg.Add(1)
	defer e.wg.Done()
	e.mu.Unlock()
	// Close must reach a session being opened too: during an outage the
	// backend's client may wait for a connection until its ctx ends, and
	// Run's ctx often never does.
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(e.ctx, cancel)
	defer stop()
	sess, err := e.b.OpenSession(octx, SessionOptions{TTL: e.cfg.TTL, RenewInterval: e.cfg.RenewInterval, DeadlineMargin: e.cfg.DeadlineMargin, Now: e.clock.Now})
	if err != nil {
		if e.ctx.Err() != nil && ctx.Err() == nil {
			return nil, tenure.ErrClosed
		}
		return nil, e.ctxErr(ctx, err)
	}
	l := newLease(sess, e.clock, e.cfg.DeadlineMargin, e.cfg.CleanupTimeout, e.log, e.rec.sessionLost, e.rec.renewalFailed)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		e.stopLeaseLocked(l, tenure.ErrClosed)
		return nil, tenure.ErrClosed
	}
	e.lease = l
	return l, nil
}

// stopLeaseLocked stops l with cause in the background: closing a session
// may take up to CleanupTimeout (a revoke on a dead link), and nothing
// should wait for that but Close, which waits for e.wg. e.mu must be held.
func (e *Elector) stopLeaseLocked(l *lease, cause error) {
	if e.lease == l {
		e.lease = nil
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		l.stop(cause)
	}()
}

// retireLeaseLocked stops l, which can no longer be trusted, once no
// elected work holds it: closing its session releases its entries, which
// must not happen while Run's work of a term of l still runs (see
// lease.hold). e.mu must be held.
func (e *Elector) retireLeaseLocked(l *lease) {
	if e.lease == l {
		e.lease = nil
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		<-l.idleCh()
		l.stop(errLeaseRetired)
	}()
}

// errLeaseRetired ends a lease retired for having looked expired (its
// deadline passed, or its session ended), should it not have ended yet.
var errLeaseRetired = fmt.Errorf("%w: lease retired: its deadline passed or its session ended", tenure.ErrLeaseExpired)

// errSessionGivenUp ends a lease given up after one of its entries could
// not be deleted: not a Close, so Run campaigns again on a new session.
var errSessionGivenUp = fmt.Errorf("%w: session given up: an entry could not be deleted", tenure.ErrSessionExpired)

// acquire takes sem, one of the elector's one-at-a-time slots, waiting
// until ctx ends or the elector closes; with wait false it does not wait,
// and returns busy() when the slot is taken (busy is called only then).
func (e *Elector) acquire(ctx context.Context, sem chan struct{}, wait bool, busy func() error) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	if !wait {
		return busy()
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return errors.Join(tenure.ErrCanceled, ctx.Err())
	case <-e.ctx.Done():
		return tenure.ErrClosed
	}
}

// unfinishedWork returns the done channel of Run's elected work of this
// elector's latest term while that work has not returned, whether or not
// the term has ended; nil otherwise.
func (e *Elector) unfinishedWork() chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lead == nil || e.lead.work == nil {
		return nil
	}
	select {
	case <-e.lead.work:
		return nil
	default:
		return e.lead.work
	}
}

// waitClosed waits until ch is closed, ctx ends or the elector closes.
func (e *Elector) waitClosed(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return errors.Join(tenure.ErrCanceled, ctx.Err())
	case <-e.ctx.Done():
		return tenure.ErrClosed
	}
}

// giveUp abandons l after an entry could not be deleted: its renewals stop
// and its session is closed, so the entry goes with it, at the latest when
// the server expires the lease; a later campaign opens a new session.
func (e *Elector) giveUp(l *lease) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		// Close stops the current lease, and a lease replaced earlier was
		// retired (stopped) then; counting another stop in e.wg now could
		// race Close's e.wg.Wait.
		return
	}
	e.stopLeaseLocked(l, errSessionGivenUp)
}

// errNilContext is the error of a call given a nil context: a
// programming error, refused before it changes anything (the Go
// convention is a panic, which a recovering caller, such as net/http's
// server, would survive with the elector's state half changed).
var errNilContext = fmt.Errorf("%w: nil context", tenure.ErrInvalidConfig)

// ctxErr turns a failure that happened because ctx ended into
// tenure.ErrCanceled joined with ctx.Err().
func (e *Elector) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.Join(tenure.ErrCanceled, ctx.Err())
	}
	return err
}

// Campaign blocks until this candidate leads cfg.Key and returns its term.
// Candidates are served in arrival order. If this elector already leads, it
// returns the current term at once.
//
// It returns tenure.ErrCanceled joined with ctx.Err() when ctx ends, an error
// wrapping tenure.ErrSessionExpired as soon as the session dies while
// waiting (including a lease deadline passing while cut off), and
// tenure.ErrClosed after Close. On every error path it removes its own
// entry, on a fresh context bounded by Config.CleanupTimeout.
//
// After Campaign returns, Done is closed and Err is set when the term is
// lost. While Run's elected work of an ended term is still stopping,
// Campaign waits for it (its entry stays until then): do not call
// Campaign from inside OnElected after OnElected's ctx has ended.
func (e *Elector) Campaign(ctx context.Context) (tenure.Term, error) {
	if ctx == nil {
		return tenure.Term{}, errNilContext
	}
	ld, err := e.campaign(ctx, true, false)
	if err != nil {
		return tenure.Term{}, err
	}
	return ld.term, nil
}

// TryCampaign is Campaign that does not wait: when another candidate holds
// or is queued before this one, it removes its entry and returns
// tenure.ErrLocked. It returns tenure.ErrLocked at once, too, while another
// campaign of this elector is in progress or while the elected work of its
// ended term (Run's) is still stopping.
func (e *Elector) TryCampaign(ctx context.Context) (tenure.Term, error) {
	if ctx == nil {
		return tenure.Term{}, errNilContext
	}
	ld, err := e.campaign(ctx, false, false)
	if err != nil {
		return tenure.Term{}, err
	}
	return ld.term, nil
}

// campaign runs one campaign; wait=false refuses a held key; managed marks
// the term as Run's, whose work holds the lease until it returns.
func (e *Elector) campaign(ctx context.Context, wait, managed bool) (*leadership, error) {
	if ctx.Err() != nil {
		return nil, errors.Join(tenure.ErrCanceled, ctx.Err())
	}
	busy := func() error {
		return fmt.Errorf("%w: another campaign of this elector is in progress on %q", tenure.ErrLocked, e.cfg.Key)
	}
	if err := e.acquire(ctx, e.campaignSem, wait, busy); err != nil {
		return nil, err
	}
	defer func() { <-e.campaignSem }()
	// A live term is returned. An ended term of Run's whose elected work
	// still runs keeps its entry until the work has returned (Run releases
	// it then): a campaign that went on would find that same entry (one per
	// session and key) and replace it, and the next candidate would lead
	// during the work. So wait for the work, then look again (a late
	// renewal can make the term live again).
	for {
		if ld, ok := e.takeLive(managed); ok {
			return ld, nil
		}
		work := e.unfinishedWork()
		if work == nil {
			break
		}
		if !wait {
			return nil, fmt.Errorf("%w: this elector's last term on %q is still stopping its elected work", tenure.ErrLocked, e.cfg.Key)
		}
		if err := e.waitClosed(ctx, work); err != nil {
			return nil, err
		}
	}
	start := e.clock.Now()
	l, err := e.currentLease(ctx)
	if err != nil {
		return nil, err
	}
	// waitCtx ends when the caller gives up or the session dies.
	waitCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopAfter := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	defer stopAfter()

	t, err := l.sess.Enqueue(waitCtx, e.cfg.Key, e.cfg.Identity)
	if err == nil && t.Token != 0 && t.Token <= e.lastToken() {
		// An entry an earlier term of this session left behind (its
		// resignation failed, or the term has just ended): a new term must
		// get a new, larger token. That term's context ends before its
		// entry goes, as at a resignation.
		e.endTermOf(t)
		if err = l.sess.Dequeue(waitCtx, t); err != nil {
			// The ended term's entry must not stay at the head of the
			// queue: try again on a fresh bounded ctx, or give up the
			// session, which takes the entry with it (classified first:
			// a session given up is not why the campaign failed).
			return nil, e.failCampaign(ctx, l, t, err)
		}
		t, err = l.sess.Enqueue(waitCtx, e.cfg.Key, e.cfg.Identity)
	}
	if err != nil {
		return nil, e.campaignErr(ctx, l, err)
	}
	log := e.log.With(zap.Uint64("token", t.Token))
	e.setPending(t, l)
	defer e.clearPending()
	if !wait {
		n, err := l.sess.Ahead(waitCtx, t)
		if err == nil && n > 0 {
			e.rec.skippedHeld()
			e.cleanup(ctx, l, t)
			return nil, fmt.Errorf("%w: %d candidate(s) ahead on %q", tenure.ErrLocked, n, e.cfg.Key)
		}
		if err != nil {
			return nil, e.failCampaign(ctx, l, t, err)
		}
	}
	log.Debug("campaign queued")
	head, err := l.sess.WaitHead(waitCtx, t)
	if err != nil {
		return nil, e.failCampaign(ctx, l, t, err)
	}
	if head.Token != t.Token { // issued at the head (see Session.WaitHead)
		log = e.log.With(zap.Uint64("token", head.Token))
	}
	t = head
	if t.Token == 0 {
		e.cleanup(ctx, l, t)
		return nil, fmt.Errorf("tenure: backend %s granted %q without a token", e.b.Name(), e.cfg.Key)
	}
	// Ownership was re-read by WaitHead; the lease must still be trusted.
	if !l.Valid() {
		return nil, e.failCampaign(ctx, l, t, tenure.ErrLeaseExpired)
	}
	term := tenure.Term{Token: t.Token, Key: e.cfg.Key, Identity: e.cfg.Identity, Backend: e.b.Name(), Entry: t.Name,
		Advisory: !e.b.Linearizable(), Since: e.clock.Now()}
	ld := e.startLeadership(l, t, term, managed)
	if ld == nil { // Close came first: do not lead
		e.cleanup(ctx, l, t)
		return nil, tenure.ErrClosed
	}
	e.rec.elected(term.Since.Sub(start))
	log.Info("elected", zap.Duration("waited", term.Since.Sub(start)), zap.Time("deadline", l.Deadline()))
	return ld, nil
}

// failCampaign classifies a campaign's failure, then removes its entry.
// In that order: a cleanup that fails gives up the session, and the
// campaign must report why it failed, not that its session was given up.
func (e *Elector) failCampaign(ctx context.Context, l *lease, t Ticket, err error) error {
	err = e.campaignErr(ctx, l, err)
	e.cleanup(ctx, l, t)
	return err
}

// campaignErr classifies a failed campaign: a refusal of the
// configuration (permission denied, a bad key) first, since the backend may
// end the session because of it (it could not delete what it may have
// written); then the caller's ctx (a backend may end the session when the
// caller gives up, see campaign); then the session's end; then the
// backend's own error.
func (e *Elector) campaignErr(ctx context.Context, l *lease, err error) error {
	if errors.Is(err, tenure.ErrInvalidConfig) {
		return err
	}
	if ctx.Err() != nil {
		// The caller gave up. The session may have ended meanwhile (a
		// backend ends it when a write given up in flight could still
		// land), but that is not why the campaign failed.
		return e.ctxErr(ctx, err)
	}
	if l.ctx.Err() != nil {
		cause := context.Cause(l.ctx)
		if errors.Is(cause, tenure.ErrClosed) {
			return tenure.ErrClosed
		}
		if !errors.Is(cause, tenure.ErrSessionExpired) {
			cause = fmt.Errorf("%w: %w", tenure.ErrSessionExpired, cause)
		}
		return cause
	}
	if errors.Is(err, tenure.ErrLeaseExpired) {
		return fmt.Errorf("%w: %w", tenure.ErrSessionExpired, err)
	}
	return e.ctxErr(ctx, err)
}

// setPending records the campaign in progress for Position: a copy of its
// ticket, which the campaign goes on changing.
func (e *Elector) setPending(t Ticket, l *lease) {
	e.mu.Lock()
	e.pending, e.pendingLease = &t, l
	e.mu.Unlock()
}

func (e *Elector) clearPending() {
	e.mu.Lock()
	e.pending, e.pendingLease = nil, nil
	e.mu.Unlock()
}

// Position returns how many candidates are queued ahead of this elector's
// campaign in progress: 0 when it leads or is about to. It returns
// tenure.ErrNotLeader wrapped in an explanatory error when no campaign is in
// progress and this elector does not lead.
func (e *Elector) Position(ctx context.Context) (int, error) {
	if ctx == nil {
		return 0, errNilContext
	}
	if e.IsLeader() {
		return 0, nil
	}
	e.mu.Lock()
	t, l := e.pending, e.pendingLease
	e.mu.Unlock()
	if t == nil {
		return 0, fmt.Errorf("%w: no campaign in progress", tenure.ErrNotLeader)
	}
	n, err := l.sess.Ahead(ctx, *t)
	if err != nil {
		return 0, e.ctxErr(ctx, err)
	}
	return n, nil
}

// cleanup removes t's entry on a fresh context bounded by CleanupTimeout.
func (e *Elector) cleanup(ctx context.Context, l *lease, t Ticket) {
	if l.ctx.Err() != nil {
		return // the session is gone or being closed: its entries go with it
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CleanupTimeout)
	defer cancel()
	if err := l.sess.Dequeue(cctx, t); err != nil {
		e.log.Warn("removing the campaign's entry failed; giving up the session, which takes the entry with it",
			zap.Uint64("token", t.Token), zap.Error(err))
		e.giveUp(l)
	}
}

// manage makes ld Run's term: its entry is not released, nor its lease's
// session closed, before finish. e.mu must be held.
func (ld *leadership) manage() {
	ld.work = make(chan struct{})
	ld.workDone = make(chan struct{})
	ld.hardStop = make(chan struct{})
	ld.hardStopDone = make(chan struct{})
	ld.lease.hold()
}

// finish ends Run's hold on the term once: Resign and Close may release
// the entry, and the lease's session may close.
func (ld *leadership) finish(e *Elector) {
	ld.finishOnce.Do(func() {
		e.mu.Lock()
		close(ld.work)
		e.mu.Unlock()
		ld.lease.release()
	})
}

// inHardStop reports whether Run's OnHardStop for this term has begun and
// not returned (false outside Run).
func (ld *leadership) inHardStop() bool {
	if ld.hardStop == nil {
		return false
	}
	select {
	case <-ld.hardStopDone:
		return false
	default:
	}
	select {
	case <-ld.hardStop:
		return true
	default:
		return false
	}
}

// isLoss reports whether err says why a term ended: one of the reasons
// OnDemoted documents.
func isLoss(err error) bool {
	for _, r := range []error{tenure.ErrOwnershipLost, tenure.ErrSessionExpired, tenure.ErrLeaseExpired, tenure.ErrResigned, tenure.ErrClosed} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// startLeadership records the term and starts its loss watcher, or returns
// nil when the elector was closed meanwhile.
func (e *Elector) startLeadership(l *lease, t Ticket, term tenure.Term, managed bool) *leadership {
	ctx, cancel := context.WithCancelCause(l.ctx)
	ld := &leadership{term: term, ticket: t, lease: l, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		cancel(tenure.ErrClosed)
		return nil
	}
	if managed {
		ld.manage()
	}
	e.lead = ld
	e.wg.Add(1) // Close waits for the watcher too
	go func() {
		defer e.wg.Done()
		e.watchedEnd(ld, l.sess.WatchLoss(ctx, t))
	}()
	return ld
}

// watchedEnd ends term ld once its loss watch has returned err, and
// records why it ended. (A function of its own, not part of
// startLeadership's goroutine, so that the goroutine's frame, and its
// stack, stay small while the watch waits.)
func (e *Elector) watchedEnd(ld *leadership, err error) {
	defer close(ld.done)
	if ld.ctx.Err() == nil {
		if err == nil {
			err = tenure.ErrOwnershipLost
		}
		ld.cancel(err)
	}
	cause := context.Cause(ld.ctx)
	e.mu.Lock()
	ld.ended = e.clock.Now()
	e.mu.Unlock()
	e.rec.demoted(cause)
	if !errors.Is(cause, tenure.ErrResigned) && !errors.Is(cause, tenure.ErrClosed) {
		e.log.Warn("leadership lost", zap.Uint64("token", ld.term.Token), zap.NamedError("reason", cause))
	}
}

// lastToken returns the token of the latest term this elector held, or 0.
func (e *Elector) lastToken() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lead == nil {
		return 0
	}
	return e.lead.term.Token
}

// takeLive returns the live term this elector holds, if any; managed (Run)
// takes over a term Campaign won, making the lease wait for Run's work.
// The check and the take-over happen under e.mu, so that a Resign that
// cancels the term either comes first (no take-over: Run campaigns anew)
// or finds the work to wait for.
func (e *Elector) takeLive(managed bool) (*leadership, bool) {
	ld := e.currentLeadership()
	if ld == nil {
		return nil, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ld.ctx.Err() != nil || e.lead != ld {
		return nil, false
	}
	if managed && ld.work == nil {
		ld.manage()
	}
	return ld, true
}

// endTermOf ends the latest term if t is its entry (see campaign).
func (e *Elector) endTermOf(t Ticket) {
	e.mu.Lock()
	ld := e.lead
	e.mu.Unlock()
	if ld != nil && ld.ticket.Token == t.Token {
		ld.cancel(fmt.Errorf("%w: a new campaign of this elector replaced the term's entry", tenure.ErrResigned))
	}
}

// currentLeadership returns the term this elector holds, or nil.
func (e *Elector) currentLeadership() *leadership {
	e.mu.Lock()
	ld := e.lead
	e.mu.Unlock()
	if ld == nil || ld.ctx.Err() != nil || !ld.lease.Valid() {
		return nil
	}
	return ld
}

// currentTerm returns the term this elector holds, if it still holds one.
func (e *Elector) currentTerm() (tenure.Term, bool) {
	if ld := e.currentLeadership(); ld != nil {
		return ld.term, true
	}
	return tenure.Term{}, false
}

// IsLeader reports whether this elector holds a term whose lease deadline is
// still ahead. It reads local state only.
func (e *Elector) IsLeader() bool {
	_, ok := e.currentTerm()
	return ok
}

// Term returns the term this elector holds and true, or the zero Term and
// false when it does not lead.
func (e *Elector) Term() (tenure.Term, bool) { return e.currentTerm() }

// Deadline returns the current lease deadline (the local instant at which a
// leader cut off from the backend demotes itself), or the zero time when
// there is no live session: none opened yet, or the last one ended
// (expired, lost, closed), even before the elector opens the next.
func (e *Elector) Deadline() time.Time {
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	if l == nil || l.ctx.Err() != nil || l.sess.Err() != nil {
		return time.Time{}
	}
	return l.Deadline()
}

// Suspended reports whether this elector leads while its session's last
// renewal failed and its deadline has not passed: the leader still leads,
// on borrowed time. It is false for a candidate that does not lead, whatever
// the state of its session.
func (e *Elector) Suspended() bool {
	ld := e.currentLeadership()
	return ld != nil && ld.lease.Suspended()
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel that is closed when the term returned by the latest
// successful Campaign is lost or resigned. When this elector has never led,
// the channel is already closed.
func (e *Elector) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lead == nil {
		return closedCh
	}
	return e.lead.ctx.Done()
}

// Err returns why the latest term ended: an error wrapping
// tenure.ErrResigned, tenure.ErrLeaseExpired, tenure.ErrSessionExpired,
// tenure.ErrOwnershipLost or tenure.ErrClosed; nil while it lasts;
// tenure.ErrNotLeader when this elector has never led.
func (e *Elector) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lead == nil {
		return tenure.ErrNotLeader
	}
	return context.Cause(e.lead.ctx)
}

// Resign gives up the term this elector holds: its Done channel closes with
// tenure.ErrResigned, Run's elected work (if any) is waited for, and its
// entry is deleted (guarded by its token, so a later holder's entry is never
// touched). Resign is idempotent and safe to retry; when there is nothing
// to give up, it returns nil. When the delete fails (backend unavailable),
// the session is given up too, so the entry goes at the latest when the
// server expires it, and Resign returns the error. The delete also ends
// when the lease can no longer be trusted (its entry then goes with it).
// When ctx ends while Run's elected work is still stopping, Resign returns
// tenure.ErrCanceled joined with ctx.Err(): the term has ended all the
// same, and Run deletes the entry once the work returns. Do not call
// Resign from inside OnElected: it waits for OnElected.
func (e *Elector) Resign(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	_, err := e.release(ctx, tenure.ErrResigned)
	return err
}

// release ends the current term with cause, waits for its work, and
// deletes its entry. working reports that it gave up waiting for Run's
// elected work (ctx ended): the rest happens once the work returns.
func (e *Elector) release(ctx context.Context, cause error) (working bool, err error) {
	e.mu.Lock()
	ld := e.lead
	e.mu.Unlock()
	if ld == nil {
		return false, nil
	}
	return e.releaseTerm(ctx, ld, cause)
}

// releaseTerm ends term ld with cause, waits for its work, and deletes its
// entry; working as for release.
func (e *Elector) releaseTerm(ctx context.Context, ld *leadership, cause error) (working bool, err error) {
	ld.cancel(cause)
	// The loss watcher stops on its own; the delete need not wait for it
	// (it sees the context's cause, not the delete), but release does.
	defer func() { <-ld.done }()
	e.mu.Lock()
	work := ld.work
	e.mu.Unlock()
	if work != nil {
		// Run waits for the work, with its hard stop. Asked once the hard
		// stop has begun (from OnHardStop, say, which Run waits for), the
		// release goes ahead as soon as OnElected has returned.
		// When ctx ends first, the release returns: the term has ended
		// (its cause is set), and Run deletes the entry once the work
		// returns. Asked once the hard stop has begun (from OnHardStop,
		// which Run waits for), the work's end must be acted on here: the
		// lease is let go (finish) when it comes, by a goroutine if ctx
		// ends before.
		// Asked before the hard stop began, the release waits for
		// OnHardStop too (Run closes work after it): OnHardStop may still
		// be stopping what the work left.
		select {
		case <-ld.hardStop:
			select {
			case <-ld.workDone:
				ld.finish(e)
			case <-ctx.Done():
				go func() {
					<-ld.workDone
					ld.finish(e)
				}()
				return true, e.ctxErr(ctx, nil)
			}
		default:
			select {
			case <-work:
			case <-ctx.Done():
				return true, e.ctxErr(ctx, nil)
			}
		}
	}
	e.mu.Lock()
	released := ld.released
	e.mu.Unlock()
	if released || ld.lease.ctx.Err() != nil {
		return false, nil // already deleted, or the session is gone and the entry with it
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ld.lease.ctx, cancel)
	defer stop()
	if err := ld.lease.sess.Dequeue(dctx, ld.ticket); err != nil {
		if ld.lease.ctx.Err() != nil {
			return false, nil
		}
		e.giveUp(ld.lease)
		return false, e.ctxErr(ctx, fmt.Errorf("tenure: resign %s: %w", ld.term, err))
	}
	e.mu.Lock()
	ld.released = true
	e.mu.Unlock()
	e.log.Info("resigned", zap.Uint64("token", ld.term.Token))
	return false, nil
}

// Leader reads the current leader of the key from the backend.
func (e *Elector) Leader(ctx context.Context) (tenure.Leader, error) {
	if ctx == nil {
		return tenure.Leader{}, errNilContext
	}
	l, err := e.b.Leader(ctx, e.cfg.Key)
	if err != nil {
		return tenure.Leader{}, e.ctxErr(ctx, err)
	}
	return l, nil
}

// Close ends any term this elector holds (cause tenure.ErrClosed), waits for
// Run's elected work to return, deletes the term's entry (on ctx), ends the
// session on a context bounded by Config.CleanupTimeout (releasing its
// entries), stops Observe goroutines and waits for everything it started
// to exit. When ctx ends while it waits for Run's work, it returns
// tenure.ErrCanceled joined with ctx.Err(), and the rest happens in the
// background once the work returns (never, if it never does; a later
// Close waits for it). The elector cannot be used afterwards. Close is idempotent; it
// returns the delete's error, if any, and the session ends regardless. A
// later or concurrent Close waits until the first has finished (or its own
// ctx ends: tenure.ErrCanceled joined with ctx.Err()) and returns nil;
// while OnHardStop runs it returns nil at once (called from OnHardStop, it
// would wait for itself: the first Close waits for OnHardStop). Do not
// call Close from inside OnElected: it waits for OnElected.
func (e *Elector) Close(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	e.mu.Lock()
	if e.closed {
		hard := e.lead != nil && e.lead.inHardStop()
		e.mu.Unlock()
		if hard {
			// Likely from OnHardStop, which the Close in progress waits
			// for (through Run): waiting for it would wait forever. It
			// ends the term and the session once OnHardStop returns.
			return nil
		}
		select {
		case <-e.closeDone:
			return nil
		case <-ctx.Done():
			return errors.Join(tenure.ErrCanceled, ctx.Err())
		}
	}
	e.closed = true
	e.cancelAll()
	e.mu.Unlock()
	working, err := e.release(ctx, tenure.ErrClosed)
	rest := func() {
		defer close(e.closeDone)
		e.mu.Lock()
		if e.lease != nil {
			e.stopLeaseLocked(e.lease, tenure.ErrClosed)
		}
		e.mu.Unlock()
		e.wg.Wait()
		if e.rec.m != nil {
			e.rec.m.remove(e)
		}
	}
	if working {
		// The release gave up waiting for Run's elected work: the
		// session ends once the work returns (its entry with it), in
		// the background, so that a caller (OnHardStop, say) that
		// stops the work after Close is not held up by it. The metrics
		// go now, so that a new Elector may report the key.
		if e.rec.m != nil {
			e.rec.m.remove(e)
		}
		go rest()
		return err
	}
	rest()
	return err
}
