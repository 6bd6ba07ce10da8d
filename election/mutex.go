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

	mu        sync.Mutex
	held      bool          // a Lock or TryLock took the token and no Unlock gave it back
	locking   chan struct{} // while a Lock or TryLock campaigns; closed once it has recorded its result
	unlocking chan struct{} // while an Unlock releases; closed once it has
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
	if ctx == nil {
		return tenure.Term{}, errNilContext
	}
	start := m.e.clock.Now()
	select {
	case <-m.local:
	case <-ctx.Done():
		return tenure.Term{}, errors.Join(tenure.ErrCanceled, ctx.Err())
	case <-m.closed:
		return tenure.Term{}, tenure.ErrClosed
	case <-m.e.ctx.Done(): // closed through Elector()
		return tenure.Term{}, tenure.ErrClosed
	}
	t, err := m.campaign(func() (tenure.Term, error) { return m.e.Campaign(ctx) })
	if err != nil {
		return tenure.Term{}, err
	}
	m.e.rec.lockWait(m.e.clock.Now().Sub(start))
	return t, nil
}

// campaign runs a campaign of the goroutine that took the local token,
// and records its result: held, or the token given back. An Unlock that
// comes once the term is visible (Held is true) but before the result is
// recorded waits for it (see Unlock).
func (m *Mutex) campaign(run func() (tenure.Term, error)) (tenure.Term, error) {
	settled := make(chan struct{})
	m.mu.Lock()
	m.locking = settled
	m.mu.Unlock()
	t, err := run()
	m.mu.Lock()
	m.locking = nil
	m.held = err == nil
	m.mu.Unlock()
	close(settled)
	if err != nil {
		m.local <- struct{}{}
	}
	return t, err
}

// TryLock takes the lock only if nobody holds it or waits for it, and
// returns tenure.ErrLocked at once otherwise (also when another goroutine of
// this process holds it).
func (m *Mutex) TryLock(ctx context.Context) (tenure.Term, error) {
	if ctx == nil {
		return tenure.Term{}, errNilContext
	}
	select {
	case <-m.local:
	default:
		return tenure.Term{}, fmt.Errorf("%w: held by this process", tenure.ErrLocked)
	}
	return m.campaign(func() (tenure.Term, error) { return m.e.TryCampaign(ctx) })
}

// Unlock releases the lock: the next waiter in line takes it. It is
// idempotent and safe to retry (see Elector.Resign); unlocking a Mutex that
// is not held returns nil and frees nothing another goroutine waits on.
// An Unlock that comes while a Lock of this process returns (the lock is
// held, Held is true, and Lock has not returned yet) releases that hold.
// One that comes while another Unlock releases waits for it, and returns
// nil: it never releases the hold a goroutine takes next. Both waits end
// with ctx (tenure.ErrCanceled joined with ctx.Err()).
func (m *Mutex) Unlock(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	for {
		m.mu.Lock()
		var wait chan struct{}
		switch {
		case m.unlocking != nil:
			// Another Unlock releases this hold: wait for it, and no
			// more (looking again could find, and release, the hold of
			// the next goroutine to lock).
			ch := m.unlocking
			m.mu.Unlock()
			select {
			case <-ch:
				return nil
			case <-ctx.Done():
				return errors.Join(tenure.ErrCanceled, ctx.Err())
			}
		case !m.held && m.locking != nil && m.e.IsLeader():
			wait = m.locking
		case !m.held:
			m.mu.Unlock()
			return nil
		}
		if wait != nil {
			m.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return errors.Join(tenure.ErrCanceled, ctx.Err())
			}
		}
		// Not under m.mu: the release may take a while (the backend is
		// slow or gone, until the lease deadline), and Held, Done and a
		// concurrent Unlock's ctx must not wait for it.
		done := make(chan struct{})
		m.unlocking = done
		m.mu.Unlock()
		err := m.e.Resign(ctx)
		m.mu.Lock()
		m.held, m.unlocking = false, nil
		m.mu.Unlock()
		close(done)
		m.local <- struct{}{} // the process-local slot, freed exactly once per hold
		return err
	}
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
// Lock in progress in the distributed queue: 0 while this process holds
// the lock (also when asked by a goroutine waiting locally for another
// goroutine of the process to unlock). When no campaign of this process is
// queued (none in progress, one still opening its session, or a hold that
// was lost and not yet unlocked) it returns an error wrapping
// tenure.ErrNotLeader.
func (m *Mutex) Position(ctx context.Context) (int, error) { return m.e.Position(ctx) }

// Elector returns the election under the lock (for Handler, Status, Leader).
func (m *Mutex) Elector() *Elector { return m.e }

// Close releases the lock if held, wakes goroutines waiting in Lock (they
// return tenure.ErrClosed), ends the session and waits for everything the
// Mutex started (see Elector.Close).
func (m *Mutex) Close(ctx context.Context) error {
	if ctx == nil {
		return errNilContext
	}
	m.once.Do(func() { close(m.closed) })
	return m.e.Close(ctx)
}
