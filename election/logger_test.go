package election_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// stallingSink discards what is written until stall is called; from then
// on every write blocks until unstall, as a pipe whose reader stalled.
type stallingSink struct {
	mu      sync.Mutex
	stalled chan struct{} // non-nil while stalled; closed by unstall
}

func (s *stallingSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	ch := s.stalled
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return len(p), nil
}

func (s *stallingSink) Sync() error { return nil }

func (s *stallingSink) stall() {
	s.mu.Lock()
	s.stalled = make(chan struct{})
	s.mu.Unlock()
}

func (s *stallingSink) unstall() {
	s.mu.Lock()
	if s.stalled != nil {
		close(s.stalled)
		s.stalled = nil
	}
	s.mu.Unlock()
}

// stallTTL is the TTL of stallableElector's elector.
const stallTTL = 2 * time.Second

// stallableElector returns an elector (TTL stallTTL) on a client of its
// own of a memory backend, whose logger writes to sink; the sink is
// unstalled before the elector closes.
func stallableElector(t *testing.T) (e *election.Elector, c *electiontest.Client, sink *stallingSink, ctx context.Context) {
	t.Helper()
	srv, key, ctx := setup(t)
	sink = &stallingSink{}
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), sink, zap.DebugLevel))
	c = srv.Client()
	e, err := election.New(c, election.Config{Key: key, Identity: "a", TTL: stallTTL}, election.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	t.Cleanup(sink.unstall) // before the elector closes (Cleanups run last first)
	return e, c, sink, ctx
}

// TestLease_StalledLoggerDoesNotHoldUpTheDeadline: a leader is cut off
// while its logger's sink blocks on every write (tenure exec's stderr,
// piped into a reader that stalled). The lease logs that a renewal failed,
// and then that the deadline passed: neither line can be written, and
// neither may keep the term from ending at its deadline, before the server
// could expire the session.
func TestLease_StalledLoggerDoesNotHoldUpTheDeadline(t *testing.T) {
	e, c, sink, ctx := stallableElector(t)
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	sink.stall()
	cut := time.Now()
	heal := c.CutOff()
	defer heal()
	select {
	case <-e.Done():
	case <-time.After(stallTTL):
		t.Fatalf("the term had not ended %v after the cut (TTL %v): the lease waited for its logger", stallTTL, stallTTL)
	}
	if err := e.Err(); !errors.Is(err, tenure.ErrLeaseExpired) {
		t.Fatalf("term ended with %v, want ErrLeaseExpired", err)
	}
	t.Logf("term ended %v after the cut, its logger stalled (TTL %v, margin TTL/5)", time.Since(cut), stallTTL)
}

// TestRun_StalledLoggerDoesNotHoldUpTheHardStop: a cut-off leader's work
// ignores its cancelled context while every write of the logger blocks.
// OnHardStop must run StopTimeout after the deadline all the same: the
// hard stop's own log line, which cannot be written, must not come first.
func TestRun_StalledLoggerDoesNotHoldUpTheHardStop(t *testing.T) {
	e, c, sink, ctx := stallableElector(t)
	elected, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the elector closes: Close waits for the work
	hardStop := make(chan time.Time, 1)
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() {
		runDone <- e.Run(runCtx, tenure.Callbacks{
			OnElected:  func(context.Context, tenure.Term) { close(elected); <-release }, // ignores its context
			OnHardStop: func(tenure.Term) { hardStop <- time.Now() },
		})
	}()
	<-elected
	sink.stall()
	cut := time.Now()
	heal := c.CutOff()
	defer heal()
	select {
	case at := <-hardStop:
		t.Logf("OnHardStop ran %v after the cut, the logger stalled (TTL %v)", at.Sub(cut), stallTTL)
	case <-time.After(stallTTL + time.Second):
		t.Fatalf("OnHardStop had not run %v after the cut: the hard stop waited for its logger", stallTTL+time.Second)
	}
	free()
	sink.unstall()
	stopRun()
	<-runDone
}
