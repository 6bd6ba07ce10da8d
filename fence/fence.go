package fence

import (
	"errors"
	"fmt"
	"sync"

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

// Rejected counts one refusal.
func (m *Metrics) Rejected(resource, verifier string) {
	if m != nil {
		m.rejections.WithLabelValues(resource, verifier).Inc()
	}
}

// Guard is the in-process verifier: it remembers the highest token accepted
// per resource and refuses lower ones. The zero value is ready to use; it is
// safe for concurrent use.
type Guard struct {
	// Metrics, when set, counts refusals (verifier "guard", and "http" for
	// Middleware). Default: nil, counts nothing. Set it before the Guard is
	// shared: it is read under the Guard's lock, not written under it.
	Metrics *Metrics

	mu      sync.Mutex
	highest map[string]uint64
}

// Check accepts token for resource if it is at least the highest accepted
// so far (the same term may write many times), and records it. It returns
// a *StaleError otherwise. Token 0 is never a term and is refused.
func (g *Guard) Check(resource string, token uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admitLocked(resource, token, "guard")
}

// Do runs write only if token is accepted for resource, holding the guard
// for the duration so that a newer term cannot interleave a write between
// the check and this one.
func (g *Guard) Do(resource string, token uint64, write func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.admitLocked(resource, token, "guard"); err != nil {
		return err
	}
	return write()
}

// admitLocked checks and records token; g.mu must be held.
func (g *Guard) admitLocked(resource string, token uint64, verifier string) error {
	if g.highest == nil {
		g.highest = map[string]uint64{}
	}
	h := g.highest[resource]
	if token == 0 || token < h {
		g.Metrics.Rejected(resource, verifier)
		return &StaleError{Resource: resource, Token: token, Highest: h}
	}
	g.highest[resource] = token
	return nil
}

// Highest returns the highest token accepted for resource (0 if none).
func (g *Guard) Highest(resource string) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highest[resource]
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
