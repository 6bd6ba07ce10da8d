package election

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
)

// Observe reports the leader of the key now and after every change,
// vacancy included, until ctx ends or the elector is closed; then it closes
// the channel. The channel holds one value and the latest wins: a slow
// reader skips intermediate leaders but always ends up seeing the current
// one. Consecutive duplicates are suppressed. Backend failures are logged
// (at debug level) and the observation restarts after
// Config.RetryInterval; meanwhile the channel keeps the last value and
// nothing tells the reader that it may be stale: read Leader, or the
// elector's own state (IsLeader), when that matters. Each call observes on
// its own; with Metrics, a failover seen by several observers of one
// elector is recorded once. It is safe for concurrent use.
func (e *Elector) Observe(ctx context.Context) <-chan tenure.Leader {
	out := make(chan tenure.Leader, 1)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		close(out)
		return out
	}
	e.wg.Add(1)
	e.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(e.ctx, cancel)
	go func() {
		defer e.wg.Done()
		defer close(out)
		defer stopOnClose()
		defer cancel()
		var last tenure.Leader
		first := true
		emit := func(l tenure.Leader) {
			if !first && sameLeader(l, last) {
				return
			}
			switch {
			case l.Vacant && !first && !last.Vacant:
				e.sawVacancy(last.Term.Token) // a leader's loss, as observed
			case !l.Vacant:
				e.sawLeader(l.Term.Token)
			}
			first, last = false, l
			select { // latest wins: drop the stale value, if any
			case <-out:
			default:
			}
			out <- l
		}
		for ctx.Err() == nil {
			err := e.b.Observe(ctx, e.cfg.Key, emit)
			if ctx.Err() != nil {
				return
			}
			e.log.Debug("observe failed; retrying", zap.Error(err))
			if !sleepCtx(ctx, e.cfg.RetryInterval) {
				return
			}
		}
	}()
	return out
}

// sawVacancy starts timing a vacancy: an observer saw the leader of token
// lost go. Another observer that saw the same loss, or saw it after a
// newer leader was seen, changes nothing.
func (e *Elector) sawVacancy(lost uint64) {
	e.failMu.Lock()
	defer e.failMu.Unlock()
	if e.vacantSince.IsZero() && lost >= e.seenToken {
		e.vacantSince = e.clock.Now()
	}
}

// sawLeader ends the vacancy being timed when an observer sees a leader no
// observer has seen before, and records it as a failover.
func (e *Elector) sawLeader(token uint64) {
	e.failMu.Lock()
	defer e.failMu.Unlock()
	if token <= e.seenToken {
		return // seen already, by this observer or another
	}
	e.seenToken = token
	if !e.vacantSince.IsZero() {
		e.rec.failover(e.clock.Now().Sub(e.vacantSince))
		e.vacantSince = time.Time{}
	}
}

func sameLeader(a, b tenure.Leader) bool {
	return a.Vacant == b.Vacant && a.Term.Token == b.Term.Token && a.Term.Identity == b.Term.Identity
}
