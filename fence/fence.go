package fence

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenure-go/tenure"
)

// ErrStale is wrapped by every refusal: the write carried a term lower than
// one the resource has already accepted, or the holder no longer holds.
var ErrStale = errors.New("tenure: stale term")

// StaleError details a refusal. It wraps ErrStale. A plain value, safe to
// share once returned.
type StaleError struct {
	// Resource is the fenced resource's name.
	Resource string
	// Token is the refused term.
	Token uint64
	// Highest is the highest term the resource has accepted, when known
	// (0 otherwise).
	Highest uint64
}

// Error describes the refusal: the refused term, the resource and, when
// known, the highest term accepted.
func (e *StaleError) Error() string {
	if e.Highest > 0 {
		return fmt.Sprintf("tenure: stale term %d for %s: %d already accepted", e.Token, e.Resource, e.Highest)
	}
	return fmt.Sprintf("tenure: stale term %d for %s: the holder no longer holds", e.Token, e.Resource)
}

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// Metrics counts refusals as tenure_fence_rejections_total, labelled by key
// (the resource) and backend (the verifier: guard, postgres, etcd,
// zookeeper, http). Safe for concurrent use; a nil *Metrics counts nothing.
type Metrics struct {
	rejections *prometheus.CounterVec
}

// NewMetrics registers the fence metrics on reg, which must not be nil. It
// fails when reg already holds tenure_fence_rejections_total.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tenure_fence_rejections_total",
		Help: "Writes refused because they carried a stale term, by resource (key) and verifier (backend).",
	}, []string{"key", "backend"})}
	if err := reg.Register(m.rejections); err != nil {
		return nil, fmt.Errorf("tenure: register fence metrics: %w", err)
	}
	return m, nil
}

// Rejections returns the counter vector (labels key, backend). Unlike
// Rejected, it needs a non-nil m.
func (m *Metrics) Rejections() *prometheus.CounterVec { return m.rejections }

// Rejected counts one refusal. Bytes of resource or verifier that are not
// valid UTF-8 (which a label cannot hold) are counted as U+FFFD.
func (m *Metrics) Rejected(resource, verifier string) {
	if m != nil {
		m.rejections.WithLabelValues(strings.ToValidUTF8(resource, "\uFFFD"), strings.ToValidUTF8(verifier, "\uFFFD")).Inc()
	}
}

// Guard is the in-process verifier: it remembers the highest token accepted
// per resource and refuses lower ones. The zero value is ready to use; it is
// safe for concurrent use.
//
// It remembers in memory only: a restarted process starts from nothing and
// accepts any term once. Use it for a resource that lives and dies with the
// process (its state is lost at a restart too); otherwise keep the highest
// term with the resource (pgfence, etcdfence, zkfence).
//
// Each resource has its own lock: a write under Do or Middleware holds up
// later calls for the same resource only. Calls are not re-entrant: a write
// that calls Check, Do or CheckTerm for its own resource deadlocks (Highest
// never blocks).
type Guard struct {
	// Metrics, when set, counts refusals (verifier "guard", and "http" for
	// Middleware). Default: nil, counts nothing. Set it before the Guard is
	// shared: it is read without a lock.
	Metrics *Metrics

	mu        sync.Mutex
	resources map[string]*resourceFence
}

// resourceFence is one resource's state: a lock held across check and
// write (a channel, so that a request can stop waiting for it), and the
// highest token accepted, written under the lock.
type resourceFence struct {
	lock    chan struct{}
	highest atomic.Uint64
}

func (g *Guard) resource(name string) *resourceFence {
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.resources[name]
	if r == nil {
		if g.resources == nil {
			g.resources = map[string]*resourceFence{}
		}
		r = &resourceFence{lock: make(chan struct{}, 1)}
		g.resources[name] = r
	}
	return r
}

// Check accepts token for resource if it is at least the highest accepted
// so far (the same term may write many times), and records it. It returns
// a *StaleError otherwise. An empty resource or one that is not valid
// UTF-8, token 0 (never a term) and a token above math.MaxInt64 (no backend issues one) are refused with an
// error wrapping tenure.ErrInvalidConfig, and not counted as refusals.
//
// Check is admission only: it is not atomic with any write made after it
// returns. A stale holder that passes Check, pauses, and writes after a
// newer term's Check and write overwrites that write. Guard a write with
// Do (or Middleware, which runs the handler under the resource's lock).
func (g *Guard) Check(resource string, token uint64) error {
	return g.Do(resource, token, func() error { return nil })
}

// Do runs write only if token is accepted for resource (see Check),
// holding the resource's lock for the duration so that a newer term cannot
// interleave a write between the check and this one. The token stays
// accepted when write fails: the guard cannot know whether a failed write
// had an effect, and a term that was allowed to write once stays allowed.
// A nil write is refused with an error wrapping tenure.ErrInvalidConfig.
func (g *Guard) Do(resource string, token uint64, write func() error) error {
	if write == nil {
		return fmt.Errorf("%w: fence: Do without a write", tenure.ErrInvalidConfig)
	}
	if err := checkInput(resource, token); err != nil {
		return err
	}
	r := g.resource(resource)
	r.lock <- struct{}{}
	defer func() { <-r.lock }()
	if err := g.admitLocked(r, resource, token, "guard"); err != nil {
		return err
	}
	return write()
}

// checkInput refuses what no holder can send: see Check.
func checkInput(resource string, token uint64) error {
	switch {
	case resource == "":
		return fmt.Errorf("%w: fence: empty resource name", tenure.ErrInvalidConfig)
	case !utf8.ValidString(resource): // a metrics label, and a name in errors
		return fmt.Errorf("%w: fence: resource name %q is not valid UTF-8", tenure.ErrInvalidConfig, resource)
	case token == 0:
		return fmt.Errorf("%w: fence: token 0 is not a term", tenure.ErrInvalidConfig)
	case token > math.MaxInt64:
		return fmt.Errorf("%w: fence: token %d is above every term a backend issues (%d)", tenure.ErrInvalidConfig, token, int64(math.MaxInt64))
	}
	return nil
}

// admitLocked checks and records token; r.lock must be held.
func (g *Guard) admitLocked(r *resourceFence, resource string, token uint64, verifier string) error {
	if err := g.stale(r, resource, token, verifier); err != nil {
		return err
	}
	r.highest.Store(token)
	return nil
}

// stale returns a *StaleError, counted as a refusal by verifier, when
// token is below the highest accepted for r. Without r.lock it can only
// say "stale already" (the highest only grows), not "fresh".
func (g *Guard) stale(r *resourceFence, resource string, token uint64, verifier string) error {
	if h := r.highest.Load(); token < h {
		g.Metrics.Rejected(resource, verifier)
		return &StaleError{Resource: resource, Token: token, Highest: h}
	}
	return nil
}

// Highest returns the highest token accepted for resource (0 if none). It
// never waits for a write in progress.
func (g *Guard) Highest(resource string) uint64 {
	g.mu.Lock()
	r := g.resources[resource]
	g.mu.Unlock()
	if r == nil {
		return 0
	}
	return r.highest.Load()
}

// Require returns nil when t can fence: a real term from a linearizable
// backend. It returns an error wrapping tenure.ErrInvalidConfig for the
// zero term and for an advisory term (Term.Advisory: Redis), whose token
// can go back after a failover, so that a verifier would refuse the
// rightful leader or admit a stale one. It is safe for concurrent use.
func Require(t tenure.Term) error {
	if t.Token == 0 {
		return fmt.Errorf("%w: fence: the zero term cannot write", tenure.ErrInvalidConfig)
	}
	if t.Advisory {
		return fmt.Errorf("%w: fence: term %v comes from %s, which is efficiency-only: its tokens can go back after a failover; use etcd or ZooKeeper to fence", tenure.ErrInvalidConfig, t, t.Backend)
	}
	return nil
}

// CheckTerm is Check for a whole term, refusing advisory terms first (see
// Require): the strong mode of the guard.
func (g *Guard) CheckTerm(resource string, t tenure.Term) error {
	if err := Require(t); err != nil {
		return err
	}
	return g.Check(resource, t.Token)
}
