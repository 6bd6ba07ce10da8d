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
// and the observation restarts after Config.RetryInterval.
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
				e.rec.failover(now.Sub(vacantSince))
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
			if !sleepCtx(ctx, e.cfg.RetryInterval) {
				return
			}
		}
	}()
	return out
}

func sameLeader(a, b tenure.Leader) bool {
	return a.Vacant == b.Vacant && a.Term.Token == b.Term.Token && a.Term.Identity == b.Term.Identity
}
