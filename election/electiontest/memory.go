// Package electiontest provides an in-memory election backend and the
// conformance suite that every tenure backend must pass.
//
// The in-memory backend models a single linearizable server with leases:
// each Memory is the server, each Client a process's connection to it. A
// Client can be crashed (it stops talking, releasing nothing) or cut off (its
// requests hang until their context ends), so the elector's state machine is
// tested against the same faults as the real backends.
package electiontest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Memory is an in-memory election server. Its methods are safe for
// concurrent use. Close it to stop its expiry loop.
type Memory struct {
	mu       sync.Mutex
	rev      uint64
	nextID   int64
	sessions map[int64]time.Time // live session → server-side expiry
	queues   map[string][]entry  // key → entries by ascending token
	changed  chan struct{}       // closed and replaced on every change

	stop chan struct{}
	done chan struct{}
}

type entry struct {
	token    uint64
	session  int64
	identity string
}

// NewMemory starts an in-memory server whose expiry loop checks leases
// every 5 ms.
func NewMemory() *Memory {
	m := &Memory{
		sessions: map[int64]time.Time{}, queues: map[string][]entry{},
		changed: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go m.expireLoop()
	return m
}

// Close stops the server's expiry loop. It is not idempotent.
func (m *Memory) Close() {
	close(m.stop)
	<-m.done
}

func (m *Memory) expireLoop() {
	defer close(m.done)
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-t.C:
			m.mu.Lock()
			for id, exp := range m.sessions {
				if now.After(exp) {
					m.dropSessionLocked(id)
				}
			}
			m.mu.Unlock()
		}
	}
}

// notifyLocked wakes every waiter. m.mu must be held.
func (m *Memory) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Memory) dropSessionLocked(id int64) {
	delete(m.sessions, id)
	for k, q := range m.queues {
		m.queues[k] = slices.DeleteFunc(q, func(e entry) bool { return e.session == id })
	}
	m.notifyLocked()
}

// ExpireSession ends, on the server, the session that holds identity's
// entry under key, as if its TTL had run out. It reports whether it found
// one.
func (m *Memory) ExpireSession(key, identity string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.queues[key] {
		if e.identity == identity {
			m.dropSessionLocked(e.session)
			return true
		}
	}
	return false
}

// DeleteEntry deletes the entry with token under key, as an operator
// would, and reports whether it found one.
func (m *Memory) DeleteEntry(key string, token uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.queues[key]
	n := len(q)
	m.queues[key] = slices.DeleteFunc(q, func(e entry) bool { return e.token == token })
	if len(m.queues[key]) == n {
		return false
	}
	m.notifyLocked()
	return true
}

// Entries returns how many entries key's queue holds (for leak checks).
func (m *Memory) Entries(key string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.queues[key])
}

// Client returns a new connection to the server: an election.Backend.
func (m *Memory) Client() *Client { return &Client{m: m} }

// Client is one process's connection to a Memory server. It implements
// election.Backend and is safe for concurrent use.
type Client struct {
	m *Memory

	mu      sync.Mutex
	crashed bool
	cut     chan struct{} // non-nil while cut off; closed on heal
}

var _ election.Backend = (*Client)(nil)

// Crash makes the client behave like a killed process: every later request
// fails, so nothing is renewed and nothing is released.
func (c *Client) Crash() {
	c.mu.Lock()
	c.crashed = true
	c.mu.Unlock()
}

// CutOff blackholes the client: its requests hang until their context ends
// and are then lost. heal restores it.
func (c *Client) CutOff() (heal func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cut == nil {
		c.cut = make(chan struct{})
	}
	ch := c.cut
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.cut == ch {
			close(ch)
			c.cut = nil
		}
	}
}

// gate models the network between client and server.
func (c *Client) gate(ctx context.Context) error {
	c.mu.Lock()
	crashed, cut := c.crashed, c.cut
	c.mu.Unlock()
	if crashed {
		return fmt.Errorf("%w: client crashed", tenure.ErrUnavailable)
	}
	if cut != nil {
		select {
		case <-ctx.Done():
			return errors.Join(tenure.ErrUnavailable, ctx.Err())
		case <-cut:
			return fmt.Errorf("%w: request lost while cut off", tenure.ErrUnavailable)
		}
	}
	return ctx.Err()
}

// Name returns "memory".
func (c *Client) Name() string { return "memory" }

// Linearizable returns true: the server is a single process under a mutex.
func (c *Client) Linearizable() bool { return true }

// CheckKey refuses the empty key.
func (c *Client) CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", tenure.ErrInvalidConfig)
	}
	return nil
}

// CheckTTL refuses non-positive TTLs.
func (c *Client) CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: TTL %v must be positive", tenure.ErrInvalidConfig, ttl)
	}
	return nil
}

func (m *Memory) headLocked(key string) tenure.Leader {
	q := m.queues[key]
	if len(q) == 0 {
		return tenure.Leader{Key: key, Vacant: true}
	}
	return tenure.Leader{Key: key, Term: tenure.Term{Token: q[0].token, Key: key, Identity: q[0].identity, Backend: "memory"}}
}

// Leader reads the head of key's queue.
func (c *Client) Leader(ctx context.Context, key string) (tenure.Leader, error) {
	if err := c.gate(ctx); err != nil {
		return tenure.Leader{}, err
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.m.headLocked(key), nil
}

// Observe emits the head of key's queue after every change.
func (c *Client) Observe(ctx context.Context, key string, emit func(tenure.Leader)) error {
	for {
		if err := c.gate(ctx); err != nil {
			return err
		}
		c.m.mu.Lock()
		l, ch := c.m.headLocked(key), c.m.changed
		c.m.mu.Unlock()
		emit(l)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// OpenSession grants a lease of opts.TTL and renews it every
// opts.RenewInterval.
func (c *Client) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	if err := c.CheckTTL(opts.TTL); err != nil {
		return nil, err
	}
	if opts.RenewInterval <= 0 || opts.RenewInterval >= opts.TTL {
		return nil, fmt.Errorf("%w: memory: RenewInterval %v must be positive and below the TTL %v", tenure.ErrInvalidConfig, opts.RenewInterval, opts.TTL)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	sent := opts.Now()
	if err := c.gate(ctx); err != nil {
		return nil, err
	}
	m := c.m
	m.mu.Lock()
	m.nextID++
	id := m.nextID
	m.sessions[id] = time.Now().Add(opts.TTL)
	m.mu.Unlock()
	s := &session{
		c: c, id: id, opts: opts, granted: election.Renewal{Sent: sent, TTL: opts.TTL},
		stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	s.Init()
	go s.keepAlive()
	return s, nil
}

type session struct {
	c       *Client
	id      int64
	opts    election.SessionOptions
	granted election.Renewal

	election.SessionSignals

	stop     chan struct{}
	stopOnce sync.Once
	loopDone chan struct{}
}

func (s *session) Granted() election.Renewal { return s.granted }

func (s *session) alive() bool {
	s.c.m.mu.Lock()
	defer s.c.m.mu.Unlock()
	_, ok := s.c.m.sessions[s.id]
	return ok
}

func (s *session) keepAlive() {
	defer close(s.loopDone)
	t := time.NewTicker(s.opts.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		sent := s.opts.Now()
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.RenewInterval)
		err := s.c.gate(ctx)
		cancel()
		if err != nil {
			s.Push(election.Renewal{Err: err})
			continue
		}
		m := s.c.m
		m.mu.Lock()
		_, ok := m.sessions[s.id]
		if ok {
			m.sessions[s.id] = time.Now().Add(s.opts.TTL)
		}
		m.mu.Unlock()
		if !ok {
			s.End(fmt.Errorf("%w: lease %d not found", tenure.ErrSessionExpired, s.id))
			return
		}
		s.Push(election.Renewal{Sent: sent, TTL: s.opts.TTL})
	}
}

func (s *session) Close(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.loopDone
	defer s.End(tenure.ErrClosed)
	if err := s.c.gate(ctx); err != nil {
		return err
	}
	m := s.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sessions[s.id]; ok {
		m.dropSessionLocked(s.id)
	}
	return nil
}

func (s *session) Enqueue(ctx context.Context, key, identity string) (election.Ticket, error) {
	if err := s.c.gate(ctx); err != nil {
		return election.Ticket{}, err
	}
	m := s.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.sessions[s.id]; !ok {
		return election.Ticket{}, fmt.Errorf("%w: lease %d not found", tenure.ErrSessionExpired, s.id)
	}
	for _, e := range m.queues[key] {
		if e.session == s.id {
			return election.Ticket{Key: key, Identity: e.identity, Token: e.token, Name: fmt.Sprint(e.token)}, nil
		}
	}
	m.rev++
	m.queues[key] = append(m.queues[key], entry{token: m.rev, session: s.id, identity: identity})
	m.notifyLocked()
	return election.Ticket{Key: key, Identity: identity, Token: m.rev, Name: fmt.Sprint(m.rev)}, nil
}

// position returns t's index in its queue, or an error when it is gone.
// m.mu must be held.
func (s *session) positionLocked(t election.Ticket) (int, error) {
	m := s.c.m
	for i, e := range m.queues[t.Key] {
		if e.token == t.Token && e.session == s.id {
			return i, nil
		}
	}
	if _, ok := m.sessions[s.id]; !ok {
		err := fmt.Errorf("%w: lease %d not found", tenure.ErrSessionExpired, s.id)
		s.End(err)
		return 0, err
	}
	return 0, fmt.Errorf("%w: entry %d of %q is gone", tenure.ErrOwnershipLost, t.Token, t.Key)
}

func (s *session) Ahead(ctx context.Context, t election.Ticket) (int, error) {
	if err := s.c.gate(ctx); err != nil {
		return 0, err
	}
	s.c.m.mu.Lock()
	defer s.c.m.mu.Unlock()
	return s.positionLocked(t)
}

// waitUntil re-reads t's position after every change until done says stop.
// A request lost to a cut-off is retried (as real backends retry transient
// failures) until ctx ends.
func (s *session) waitUntil(ctx context.Context, t election.Ticket, done func(pos int, err error) (bool, error)) error {
	for {
		if err := s.c.gate(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		m := s.c.m
		m.mu.Lock()
		pos, err := s.positionLocked(t)
		ch := m.changed
		m.mu.Unlock()
		if stop, err := done(pos, err); stop {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// WaitHead implements election.Session. Tokens are set at Enqueue, so t
// comes back unchanged.
func (s *session) WaitHead(ctx context.Context, t election.Ticket) (election.Ticket, error) {
	return t, s.waitHead(ctx, t)
}

func (s *session) waitHead(ctx context.Context, t election.Ticket) error {
	return s.waitUntil(ctx, t, func(pos int, err error) (bool, error) {
		return err != nil || pos == 0, err
	})
}

func (s *session) WatchLoss(ctx context.Context, t election.Ticket) error {
	return s.waitUntil(ctx, t, func(_ int, err error) (bool, error) {
		return err != nil, err
	})
}

func (s *session) Dequeue(ctx context.Context, t election.Ticket) error {
	if err := s.c.gate(ctx); err != nil {
		return err
	}
	m := s.c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	q := m.queues[t.Key]
	n := len(q)
	m.queues[t.Key] = slices.DeleteFunc(q, func(e entry) bool { return e.token == t.Token })
	if len(m.queues[t.Key]) != n {
		m.notifyLocked()
	}
	return nil
}
