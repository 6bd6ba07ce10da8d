package election

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
)

// Run campaigns, leads and campaigns again until ctx ends or the elector is
// closed. Each time it is elected it runs cb.OnElected in its own goroutine
// with a context that is cancelled the moment leadership can no longer be
// guaranteed; it waits for OnElected to return (running cb.OnHardStop if it
// has not returned Config.StopTimeout after its context ended), resigns
// unless the session is already gone, runs cb.OnDemoted with the reason, and
// campaigns again. OnElected returning on its own is a resignation. If
// cb.OnLeader is set, Run observes the key and reports its changes, the
// latest winning over those a slow OnLeader has not taken yet (Observe);
// when it has led, it reads the key once more before it returns (for at
// most RenewInterval) and reports the holder its resignation left, if the
// observer had not.
//
// When ctx ends, Run stops the elected work, resigns, and returns
// tenure.ErrCanceled joined with ctx.Err(). It returns tenure.ErrClosed after
// Close and a tenure.ErrInvalidConfig error when the backend refuses the
// configuration; transient failures are logged and retried every
// Config.RetryInterval. Run returns only after every goroutine it started
// has exited. A second Run on the same Elector waits for the first to
// return (or for its own ctx to end, or Close). Close (or Resign) from
// another goroutine ends the term like a loss would: Run waits for
// OnElected before the entry is released.
func (e *Elector) Run(ctx context.Context, cb tenure.Callbacks) error {
	if ctx == nil {
		return errNilContext
	}
	if err := e.acquire(ctx, e.runSem, true, nil); err != nil {
		return err
	}
	defer func() { <-e.runSem }()
	// led: a term of this Run's ended, so its last OnLeader may be stale.
	led := false
	if cb.OnLeader != nil || e.rec.m != nil { // the observer also measures failovers
		// Not stopped by ctx: Run resigns after ctx ends, and OnLeader
		// should end with the state that leaves.
		obsCtx, stopObs := context.WithCancel(context.WithoutCancel(ctx))
		leaders := e.Observe(obsCtx)
		obsDone := make(chan struct{})
		var last tenure.Leader // the last one OnLeader got; read after obsDone
		go func() {
			defer close(obsDone)
			for l := range leaders {
				if cb.OnLeader != nil {
					last = l
					e.safely("OnLeader", func() { cb.OnLeader(l) })
				}
			}
		}()
		defer func() {
			stopObs()
			<-obsDone
			if cb.OnLeader == nil || last.Key == "" || !led {
				return
			}
			// The observer may have stopped before it saw the resignation
			// (or Close) that Run just made: read the key once more, for
			// at most a renewal interval.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(e.cfg.CleanupTimeout, e.cfg.RenewInterval))
			defer cancel()
			if l, err := e.Leader(fctx); err == nil && !sameLeader(l, last) {
				done := make(chan struct{})
				go func() { // OnLeader runs on a goroutine of its own
					defer close(done)
					e.safely("OnLeader", func() { cb.OnLeader(l) })
				}()
				<-done
			}
		}()
	}
	for {
		ld, err := e.campaign(ctx, true, true)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return errors.Join(tenure.ErrCanceled, ctx.Err())
		case errors.Is(err, tenure.ErrClosed), errors.Is(err, tenure.ErrInvalidConfig):
			return err
		default:
			e.log.Debug("campaign failed; retrying", zap.Error(err), zap.Duration("retry_in", e.cfg.RetryInterval))
			if !sleepCtx(ctx, e.cfg.RetryInterval, e.ctx.Done()) {
				if ctx.Err() == nil {
					return tenure.ErrClosed // Close, while Run waited to retry
				}
				return errors.Join(tenure.ErrCanceled, ctx.Err())
			}
			continue
		}
		term := ld.term
		led = true
		reason := e.lead1(ctx, ld, cb)
		e.safely("OnDemoted", func() {
			if cb.OnDemoted != nil {
				cb.OnDemoted(term, reason)
			}
		})
		if errors.Is(reason, tenure.ErrClosed) {
			return tenure.ErrClosed
		}
		if ctx.Err() != nil {
			return errors.Join(tenure.ErrCanceled, ctx.Err())
		}
	}
}

// lead1 runs one term: OnElected until it returns, then resigns if the
// session lives. It returns the demotion reason.
func (e *Elector) lead1(ctx context.Context, ld *leadership, cb tenure.Callbacks) error {
	term, lctx := ld.term, ld.ctx
	workDone := ld.workDone
	var panicked error
	go func() {
		defer close(ld.workDone)
		if cb.OnElected == nil {
			<-lctx.Done()
			return
		}
		panicked = e.safely("OnElected", func() { cb.OnElected(lctx, term) })
	}()
	select {
	case <-workDone:
	case <-lctx.Done():
	case <-ctx.Done():
	}
	// Ask the work to stop (no-op if the term already ended), then wait.
	ld.cancel(tenure.ErrResigned)
	e.awaitWork(ld, cb)
	ld.finish(e) // Resign and Close may release the entry now
	<-ld.done
	reason := context.Cause(lctx)
	if !isLoss(reason) {
		// The loss watch failed without proving the term lost (a
		// backend's transient error; the watcher logged it): the entry
		// is still there with its session, so Run gives it up.
		reason = fmt.Errorf("%w: the backend could not watch the entry: %w", tenure.ErrResigned, reason)
	}
	if panicked != nil {
		if errors.Is(reason, tenure.ErrResigned) { // the term was live: the panic ended it
			reason = fmt.Errorf("%w: %w", tenure.ErrResigned, panicked)
		} else { // it had ended already (lease, session, ownership, Close): say why first
			reason = fmt.Errorf("%w; then %w", reason, panicked)
		}
	}
	if errors.Is(reason, tenure.ErrResigned) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CleanupTimeout)
		if _, err := e.releaseTerm(rctx, ld, tenure.ErrResigned); err != nil { // this term's, whatever e.lead is now
			e.log.Warn("resign failed; the entry goes when the session expires", zap.Error(err))
		}
		cancel()
	}
	if errors.Is(reason, tenure.ErrResigned) || errors.Is(reason, tenure.ErrClosed) {
		e.log.Info("demoted", zap.Uint64("token", term.Token), zap.NamedError("reason", reason))
	} else {
		e.log.Warn("demoted", zap.Uint64("token", term.Token), zap.NamedError("reason", reason))
	}
	return reason
}

// hardStopFlush bounds how long the default OnHardStop waits for its log
// line and message before it exits.
const hardStopFlush = 100 * time.Millisecond

// awaitWork waits for the elected work to return; after StopTimeout it runs
// OnHardStop once and keeps waiting: leadership is not released while the
// work runs.
func (e *Elector) awaitWork(ld *leadership, cb tenure.Callbacks) {
	term, workDone := ld.term, ld.workDone
	t := time.NewTimer(e.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-workDone:
		return
	case <-t.C:
	}
	// The hard stop must not wait for the logger, nor for stderr: a sink
	// that blocks (a stalled reader) would keep the work running into the
	// successor's term.
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		e.log.Error("elected work ignored its cancelled context past StopTimeout; hard stop",
			zap.Uint64("token", term.Token), zap.Duration("stop_timeout", e.cfg.StopTimeout))
	}()
	hard := cb.OnHardStop
	if hard == nil {
		hard = func(tenure.Term) {
			flushed := make(chan struct{})
			go func() {
				defer close(flushed)
				<-logged
				_ = e.log.Sync()
				fmt.Fprintf(os.Stderr, "tenure: elected work for %s did not stop within %v; exiting\n", term, e.cfg.StopTimeout)
			}()
			t := time.NewTimer(hardStopFlush)
			select {
			case <-flushed:
			case <-t.C:
			}
			os.Exit(1)
		}
	}
	close(ld.hardStop) // a release asked from now on goes ahead once the work returns
	e.safely("OnHardStop", func() { hard(term) })
	close(ld.hardStopDone)
	<-workDone
}

// safely runs a callback, turning a panic into an error wrapping
// tenure.ErrCallbackPanic.
func (e *Elector) safely(name string, f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: %v", tenure.ErrCallbackPanic, name, r)
			msg := "callback panicked; recovered"
			if name == "OnElected" {
				msg = "callback panicked; treated as a resignation"
			}
			e.log.Error(msg, zap.String("callback", name), zap.Any("panic", r))
		}
	}()
	f()
	return nil
}

// sleepCtx waits d. It returns false, sooner, when ctx ends or also (when
// not nil) is closed.
func sleepCtx(ctx context.Context, d time.Duration, also <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-also: // nil: never
		return false
	}
}
