package election_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// newMutex returns a Mutex on its own client of srv, closed when the test
// ends.
func newMutex(t *testing.T, srv *electiontest.Memory, key, id string, opts ...election.Option) (*election.Mutex, *electiontest.Client) {
	t.Helper()
	c := srv.Client()
	m, err := election.NewMutex(c, election.Config{Key: key, Identity: id, TTL: 2 * time.Second}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m, c
}

// TestMutex_UnlockWhileLockReturnsReleases: once a Lock's term is
// visible (Held is true) and before Lock has returned, an Unlock from
// another goroutine must release that hold. Before, it found nothing
// recorded, returned nil and released nothing: the process held the lock
// for good while its caller believed it unlocked.
func TestMutex_UnlockWhileLockReturnsReleases(t *testing.T) {
	srv, key, ctx := setup(t)
	gate, inside := make(chan struct{}), make(chan struct{})
	hook := func(e zapcore.Entry) error {
		if e.Message == "elected" {
			close(inside)
			<-gate
		}
		return nil
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.DebugLevel), zap.Hooks(hook))
	m, _ := newMutex(t, srv, key, "a", election.WithLogger(log))
	locked := make(chan error, 1)
	go func() { _, err := m.Lock(ctx); locked <- err }()
	<-inside // elected, Lock not returned yet
	if !m.Held() {
		t.Fatal("Held is false once elected: the test shows nothing")
	}
	unlocked := make(chan error, 1)
	go func() {
		uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		unlocked <- m.Unlock(uctx)
	}()
	time.Sleep(100 * time.Millisecond) // Unlock runs into the window
	close(gate)
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if m.Held() {
		t.Fatal("still held after an Unlock that returned nil")
	}
	other, _ := newMutex(t, srv, key, "b")
	if _, err := other.TryLock(ctx); err != nil {
		t.Fatalf("another process cannot take the lock after Unlock: %v", err)
	}
}

// TestMutex_NilContextIsAnError: a nil ctx is refused with an error, and
// leaves the Mutex usable. Before, TryLock(nil) panicked after taking the
// process's token (a recovered panic left every later Lock waiting), and
// Observe(nil) panicked after counting a goroutine that Close then waited
// for forever.
func TestMutex_NilContextIsAnError(t *testing.T) {
	srv, key, ctx := setup(t)
	m, _ := newMutex(t, srv, key, "a")
	call := func(name string, f func() error) {
		t.Helper()
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					err = errors.New("panic")
					t.Errorf("%s(nil) panicked: %v", name, r)
				}
			}()
			err = f()
		}()
		if err == nil || !errors.Is(err, tenure.ErrInvalidConfig) && err.Error() != "panic" {
			t.Errorf("%s(nil) = %v, want an error wrapping ErrInvalidConfig", name, err)
		}
	}
	//nolint:staticcheck // a nil ctx is the point
	call("TryLock", func() error { _, err := m.TryLock(nil); return err })
	//nolint:staticcheck
	call("Lock", func() error { _, err := m.Lock(nil); return err })
	//nolint:staticcheck
	call("Unlock", func() error { return m.Unlock(nil) })
	e := m.Elector()
	//nolint:staticcheck
	call("Campaign", func() error { _, err := e.Campaign(nil); return err })
	//nolint:staticcheck
	call("Run", func() error { return e.Run(nil, tenure.Callbacks{}) })
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Observe(nil) panicked: %v", r)
			}
		}()
		//nolint:staticcheck
		if _, ok := <-e.Observe(nil); ok {
			t.Error("Observe(nil) delivered a value; want a closed channel")
		}
	}()
	//nolint:staticcheck
	call("Close", func() error { return m.Close(nil) })
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := range 10 { // a half-closed Mutex would refuse some of them
		if _, err := m.Lock(lctx); err != nil {
			t.Fatalf("Lock %d after the nil calls: %v", i, err)
		}
		if i < 9 {
			if err := m.Unlock(lctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.Unlock(lctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(lctx); err != nil {
		t.Fatalf("Close after the nil calls: %v", err)
	}
}

// TestMutex_UnlockWaitingForAnotherUnlockEndsWithItsContext: while one
// Unlock waits for a backend that went silent, another Unlock with a
// short ctx returns when that ctx ends. Before, it waited for the first,
// until the lease deadline, and then returned nil.
func TestMutex_UnlockWaitingForAnotherUnlockEndsWithItsContext(t *testing.T) {
	srv, key, ctx := setup(t)
	m, c := newMutex(t, srv, key, "a")
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	c.CutOff()
	first := make(chan error, 1)
	go func() { first <- m.Unlock(context.Background()) }()
	time.Sleep(100 * time.Millisecond) // the first Unlock waits for the backend
	uctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	begun := time.Now()
	err := m.Unlock(uctx)
	took := time.Since(begun)
	t.Logf("second Unlock: %v after %v", err, took)
	if !errors.Is(err, tenure.ErrCanceled) || took > time.Second {
		t.Errorf("second Unlock = %v after %v, want ErrCanceled when its 100 ms ctx ends", err, took)
	}
	<-first
}

// TestMutex_ElectorCloseWakesLocalWaiters: closing the Mutex through the
// Elector it exposes wakes goroutines waiting locally behind the holder.
// Before, only Mutex.Close did; they waited until their own ctx ended.
func TestMutex_ElectorCloseWakesLocalWaiters(t *testing.T) {
	srv, key, ctx := setup(t)
	m, _ := newMutex(t, srv, key, "a")
	if _, err := m.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { _, err := m.Lock(context.Background()); waiting <- err }()
	time.Sleep(100 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := m.Elector().Close(cctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, tenure.ErrClosed) {
			t.Errorf("waiting Lock = %v, want ErrClosed", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a Lock waiting locally did not return when the Elector was closed")
	}
}

// TestSessionSignals_ZeroValueIsReady: Push and End on a SessionSignals
// that nobody Init'ed. Before, Push spun forever on nil channels and End
// panicked.
func TestSessionSignals_ZeroValueIsReady(t *testing.T) {
	var s election.SessionSignals
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Push(election.Renewal{})
		s.Push(election.Renewal{})
		if !s.End(tenure.ErrSessionExpired) {
			t.Error("the first End did not end the session")
		}
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Push or End on the zero value did not return")
	}
	select {
	case <-s.Renewals():
	default:
		t.Error("no renewal to read after Push")
	}
	select {
	case <-s.Done():
	default:
		t.Error("Done not closed after End")
	}
	if !errors.Is(s.Err(), tenure.ErrSessionExpired) {
		t.Errorf("Err = %v", s.Err())
	}
}
