package election

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
)

// lease owns one backend session and its local deadline. Its ctx is
// cancelled, with the reason as cause, the moment the session can no longer
// be trusted: the deadline passed (tenure.ErrLeaseExpired), the backend
// reported the session dead (tenure.ErrSessionExpired), or the elector
// closed it (tenure.ErrClosed). A lease is never revived; the elector opens
// a new one.
type lease struct {
	sess   Session
	clock  Clock
	margin time.Duration
	log    *zap.Logger

	ctx    context.Context
	cancel context.CancelCauseFunc
	stopCh chan struct{}
	done   chan struct{}
	closeT time.Duration
	onLost func() // the session was lost (not closed)
	onFail func() // a renewal attempt failed
	logs   chan func(*zap.Logger)

	mu        sync.Mutex
	deadline  time.Time
	suspended bool
	stopOnce  sync.Once
	stopCause error         // why stop was asked for; set before stopCh closes
	holds     int           // elected work running under this lease
	idle      chan struct{} // closed while holds == 0
}

func newLease(sess Session, clock Clock, margin, closeTimeout time.Duration, log *zap.Logger, onLost, onFail func()) *lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	g := sess.Granted()
	l := &lease{
		sess: sess, clock: clock, margin: margin, log: log,
		ctx: ctx, cancel: cancel,
		stopCh: make(chan struct{}), done: make(chan struct{}),
		closeT:   closeTimeout,
		onLost:   onLost,
		onFail:   onFail,
		deadline: g.Sent.Add(g.TTL - margin),
		idle:     closedCh,
		logs:     make(chan func(*zap.Logger), logBacklog),
	}
	go l.run()
	go l.logLoop()
	return l
}

// Deadline returns the local instant after which the lease is not trusted.
func (l *lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Suspended reports whether the last renewal attempt failed while the
// deadline has not passed yet.
func (l *lease) Suspended() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.suspended && l.ctx.Err() == nil
}

// Valid reports whether the lease is live and its deadline is ahead. It
// also reads the session's own state, which may end before the monitor has
// noticed.
func (l *lease) Valid() bool {
	return l.ctx.Err() == nil && l.sess.Err() == nil && l.clock.Now().Before(l.Deadline())
}

// hold marks elected work as running under the lease: after the deadline,
// the session is not closed (its entries not released) before release.
func (l *lease) hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holds == 0 {
		l.idle = make(chan struct{})
	}
	l.holds++
}

// release undoes one hold.
func (l *lease) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.holds--
	if l.holds == 0 {
		close(l.idle)
	}
}

func (l *lease) idleCh() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.idle
}

// stop ends the lease with cause (unless it already ended; tenure.ErrClosed
// when the elector closes), closes the session once no elected work holds
// it, and waits for the monitor to exit.
func (l *lease) stop(cause error) {
	l.stopOnce.Do(func() {
		l.stopCause = cause
		close(l.stopCh)
	})
	<-l.done
}

// logAsync hands a log call to the lease's logging goroutine, in order,
// and drops it when logBacklog calls wait already. The monitor's work (the
// deadline, the session's end, releasing l.mu) must not wait for the
// logger: a sink that blocks (tenure exec's stderr, piped into a reader
// that stalled) would otherwise keep a cut-off leader's work running past
// its deadline, into its successor's term.
func (l *lease) logAsync(f func(*zap.Logger)) {
	select {
	case l.logs <- f:
	default: // the logger is stalled: lose the line, not the monitor's time
	}
}

// logBacklog bounds the log calls waiting for a stalled logger.
const logBacklog = 16

// logLoop makes the lease's log calls, until the monitor has exited and
// the calls handed over by then are made.
func (l *lease) logLoop() {
	for {
		select {
		case f := <-l.logs:
			f(l.log)
		case <-l.done:
			for {
				select {
				case f := <-l.logs:
					f(l.log)
				default:
					return
				}
			}
		}
	}
}

func (l *lease) apply(r Renewal) {
	if r.Err != nil {
		l.onFail() // not under l.mu: the metrics' Collect reads the lease under theirs
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Err != nil {
		if !l.suspended {
			remaining := l.deadline.Sub(l.clock.Now())
			l.logAsync(func(log *zap.Logger) {
				log.Warn("lease renewal failed; suspended until the deadline", zap.Error(r.Err), zap.Duration("remaining", remaining))
			})
		}
		l.suspended = true
		return
	}
	if d := r.Sent.Add(r.TTL - l.margin); d.After(l.deadline) {
		l.deadline = d
	}
	if l.suspended {
		l.logAsync(func(log *zap.Logger) { log.Info("lease renewal acknowledged again; no longer suspended") })
	}
	l.suspended = false
}

func (l *lease) run() {
	defer close(l.done)
	defer l.closeSession()
	timer := time.NewTimer(l.Deadline().Sub(l.clock.Now()))
	defer timer.Stop()
	for {
		select {
		case r := <-l.sess.Renewals():
			l.apply(r)
			timer.Reset(l.Deadline().Sub(l.clock.Now()))
		case <-timer.C:
			// Take any acknowledgement that raced with the timer first.
			select {
			case r := <-l.sess.Renewals():
				l.apply(r)
			default:
			}
			if left := l.Deadline().Sub(l.clock.Now()); left > 0 {
				timer.Reset(left)
				continue
			}
			l.expire()
			return
		case <-l.sess.Done():
			err := l.sess.Err()
			if err == nil || !errors.Is(err, tenure.ErrSessionExpired) && !errors.Is(err, tenure.ErrClosed) {
				err = fmt.Errorf("%w: %w", tenure.ErrSessionExpired, err)
			}
			l.cancel(err)
			if !errors.Is(err, tenure.ErrClosed) {
				l.onLost()
			}
			l.logAsync(func(log *zap.Logger) { log.Warn("session ended", zap.Error(err)) })
			if errors.Is(err, tenure.ErrClosed) {
				// Closed on this side (its backend is closing): the
				// server still has the session's entries, and closing the
				// session deletes them and lets the next candidate in. As
				// a resignation does, wait for the elected work first,
				// a stop included (Close's, in the background, once its
				// ctx ended while it waited for the work).
				<-l.idleCh()
			}
			return
		case <-l.stopCh:
			if !l.clock.Now().Before(l.Deadline()) {
				// The deadline passed before its timer fired (a campaign
				// that found the lease no longer valid retired it): end as
				// at the deadline, margin included.
				l.expire()
				return
			}
			l.cancel(l.stopCause)
			// Closing the session releases its entries: not while elected
			// work of a term of it still runs (a lease given up after a
			// failed delete may carry a newer term).
			<-l.idleCh()
			return
		}
	}
}

// expire ends the lease at its deadline: its terms end with
// ErrLeaseExpired, and the session is closed (by run's return) only
// DeadlineMargin later, and not while elected work still runs, even when
// the lease is being stopped: Close stops it in the background when its
// ctx ended while it waited for the work, to release the entries once the
// work returns.
func (l *lease) expire() {
	l.cancel(&LeaseExpiredError{Deadline: l.Deadline()})
	l.onLost()
	l.logAsync(func(log *zap.Logger) {
		log.Warn("lease deadline passed without an acknowledged renewal; session abandoned")
	})
	// Do not release the entries before the server itself could expire
	// the lease (the deadline is DeadlineMargin early), nor while elected
	// work still runs: the link may be back, and a revoke now would elect
	// the next leader at once.
	margin := time.NewTimer(l.margin)
	<-margin.C
	<-l.idleCh()
}

// closeSession ends the session on the server on a fresh bounded context:
// whatever happened, entries of an untrusted session must not linger.
func (l *lease) closeSession() {
	ctx, cancel := context.WithTimeout(context.Background(), l.closeT)
	defer cancel()
	if err := l.sess.Close(ctx); err != nil {
		l.logAsync(func(log *zap.Logger) {
			log.Debug("closing session failed; the server expires it after its TTL", zap.Error(err))
		})
	}
}

// LeaseExpiredError is why a term ends when its lease deadline passed
// without an acknowledged renewal: Err, OnDemoted's reason and the cause
// of OnElected's ctx carry it. It wraps tenure.ErrLeaseExpired.
//
// Deadline is that instant on this process's clock. A process that was
// paused past it (a long GC pause, a stopped or frozen process, a VM
// paused by its host) learns that its term ended only when it runs again,
// possibly well after Deadline, when the server may already have expired
// the lease and elected another: whatever must end before that, ends at
// once. The zero Deadline means unknown.
//
// A LeaseExpiredError is a plain value, safe to share once returned.
type LeaseExpiredError struct {
	Deadline time.Time
}

// Error returns tenure.ErrLeaseExpired's message.
func (e *LeaseExpiredError) Error() string { return tenure.ErrLeaseExpired.Error() }

// Unwrap returns tenure.ErrLeaseExpired.
func (e *LeaseExpiredError) Unwrap() error { return tenure.ErrLeaseExpired }
