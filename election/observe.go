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
// elector is recorded once. It is safe for concurrent use. A nil ctx is a
// programming error: the channel is closed at once.
func (e *Elector) Observe(ctx context.Context) <-chan tenure.Leader {
	out := make(chan tenure.Leader, 1)
	if ctx == nil { // a programming error: nothing to observe for
		close(out)
		return out
	}
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
		var vacantSince time.Time
		first := true
		emit := func(l tenure.Leader) {
			if !first && sameLeader(l, last) {
				return
			}
			now := e.clock.Now()
			switch {
			case l.Vacant && !first && !last.Vacant:
				vacantSince = now // a leader's loss, as observed
			case !l.Vacant && !vacantSince.IsZero():
				e.failoverEnded(l, now.Sub(vacantSince))
				vacantSince = time.Time{}
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
			if !sleepCtx(ctx, e.cfg.RetryInterval, nil) {
				return
			}
		}
	}()
	return out
}

// failoverEnded records a vacancy that an observer saw end with leader l,
// unless another observer of this elector has recorded the same leader's
// arrival already.
func (e *Elector) failoverEnded(l tenure.Leader, vacant time.Duration) {
	id := leaderID{l.Term.Token, l.Term.Identity}
	e.failMu.Lock()
	defer e.failMu.Unlock()
	for _, r := range e.recorded {
		if r == id {
			return
		}
	}
	e.recorded[e.nextRecorded] = id
	e.nextRecorded = (e.nextRecorded + 1) % len(e.recorded)
	e.rec.failover(vacant)
}

// leaderID names one leader's term: a token alone can repeat on Redis.
type leaderID struct {
	token    uint64
	identity string
}

func sameLeader(a, b tenure.Leader) bool {
	return a.Vacant == b.Vacant && a.Term.Token == b.Term.Token && a.Term.Identity == b.Term.Identity
}
