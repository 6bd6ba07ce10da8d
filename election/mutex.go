package election

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tenure-go/tenure"
)

// Mutex is a fair distributed lock: an election whose holder lets go when
// its work is done. Processes acquire in arrival order (first come, first
// served). Within a process, one goroutine at a time holds the Mutex or
// waits in the distributed queue; the others wait for it locally, in no
// particular order, and join the queue when it unlocks.
//
// Guarantees are the Elector's: on a linearizable backend at most one
// holder at a time, a lease deadline that ends the hold (Context and Done)
// before the server can hand the lock to another, and a Term whose Token is
// a fencing token. A Mutex refuses backends that are not linearizable.
//
// A Mutex is safe for concurrent use by many goroutines: Lock blocks while
// another goroutine of the same process holds it, as sync.Mutex does. As
// with sync.Mutex, a hold is the process's until Unlock, even after it was
// lost (Done closed): call Unlock then too before locking again. Close it
// when done; Close also wakes goroutines waiting in Lock. Create it with
// NewMutex: the zero Mutex is not usable.
type Mutex struct {
	e      *Elector
	local  chan struct{} // one holder per process: the token is in the channel while free
	closed chan struct{}
	once   sync.Once

	mu   sync.Mutex
	held bool // a Lock or TryLock took the token and no Unlock gave it back
}

// NewMutex returns a Mutex for cfg.Key on b, with cfg's defaults applied as
// for New. It refuses a backend whose tokens are not fencing tokens
// (tenure.ErrInvalidConfig).
func NewMutex(b Backend, cfg Config, opts ...Option) (*Mutex, error) {
	if b != nil && !b.Linearizable() {
		return nil, fmt.Errorf("%w: %s is not linearizable (efficiency only): a Mutex needs etcd or ZooKeeper", tenure.ErrInvalidConfig, b.Name())
	}
	e, err := New(b, cfg, opts...)
	if err != nil {
		return nil, err
	}
	m := &Mutex{e: e, local: make(chan struct{}, 1), closed: make(chan struct{})}
	m.local <- struct{}{}
	return m, nil
}

// Lock waits in arrival order until this process holds the lock and returns
// its term. It returns tenure.ErrCanceled joined with ctx.Err() when ctx
// ends, and an error wrapping tenure.ErrSessionExpired when the session dies
// while waiting, and tenure.ErrClosed after Close; on every error path its
// queue entry is removed.
func (m *Mutex) Lock(ctx context.Context) (tenure.Term, error) {
	start := m.e.clock.Now()
	select {
	case <-m.local:
	case <-ctx.Done():
		return tenure.Term{}, errors.Join(tenure.ErrCanceled, ctx.Err())
	case <-m.closed:
		return tenure.Term{}, tenure.ErrClosed
	}
	t, err := m.e.Campaign(ctx)
	if err != nil {
		m.local <- struct{}{}
		return tenure.Term{}, err
	}
	m.setHeld()
	m.e.rec.lockWait(m.e.clock.Now().Sub(start))
	return t, nil
}

func (m *Mutex) setHeld() {
	m.mu.Lock()
	m.held = true
	m.mu.Unlock()
}

// TryLock takes the lock only if nobody holds it or waits for it, and
// returns tenure.ErrLocked at once otherwise (also when another goroutine of
// this process holds it).
func (m *Mutex) TryLock(ctx context.Context) (tenure.Term, error) {
	select {
	case <-m.local:
	default:
		return tenure.Term{}, fmt.Errorf("%w: held by this process", tenure.ErrLocked)
	}
	t, err := m.e.TryCampaign(ctx)
	if err != nil {
		m.local <- struct{}{}
		return tenure.Term{}, err
	}
	m.setHeld()
	return t, nil
}

// Unlock releases the lock: the next waiter in line takes it. It is
// idempotent and safe to retry (see Elector.Resign); unlocking a Mutex that
// is not held returns nil and frees nothing another goroutine waits on.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.held {
		return nil
	}
	err := m.e.Resign(ctx)
	m.held = false
	m.local <- struct{}{} // the process-local slot, freed exactly once per hold
	return err
}

// Done returns a channel closed when the hold taken by the latest Lock ends:
// Unlock, or loss (lease deadline, session expiry, the entry deleted). It is
// closed already when nothing is held.
func (m *Mutex) Done() <-chan struct{} { return m.e.Done() }

// Err reports why the latest hold ended (see Elector.Err).
func (m *Mutex) Err() error { return m.e.Err() }

// Context returns a context that ends with the latest hold: pass it to the
// work the lock protects.
func (m *Mutex) Context() context.Context {
	m.e.mu.Lock()
	defer m.e.mu.Unlock()
	if m.e.lead == nil {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(tenure.ErrNotLeader)
		return ctx
	}
	return m.e.lead.ctx
}

// Held reports whether this process holds the lock with its lease deadline
// ahead.
func (m *Mutex) Held() bool { return m.e.IsLeader() }

// Position returns how many holders and waiters are ahead of this process's
// Lock in progress in the distributed queue (0 when this process holds the
// lock, also to a goroutine still waiting locally for another goroutine of
// the process to unlock).
func (m *Mutex) Position(ctx context.Context) (int, error) { return m.e.Position(ctx) }

// Elector returns the election under the lock (for Handler, Status, Leader).
func (m *Mutex) Elector() *Elector { return m.e }

// Close releases the lock if held, wakes goroutines waiting in Lock (they
// return tenure.ErrClosed), ends the session and waits for everything the
// Mutex started (see Elector.Close).
func (m *Mutex) Close(ctx context.Context) error {
	m.once.Do(func() { close(m.closed) })
	return m.e.Close(ctx)
}
