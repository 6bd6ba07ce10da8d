package election

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/internal/isnil"
)

// Metrics reports the state of every Elector given it with WithMetrics, on
// one prometheus.Registerer, labelled by key and backend:
//
//	tenure_is_leader                  gauge: 1 while this process leads
//	tenure_term                       gauge: the fencing token of the term this process holds (0 when it does not lead)
//	tenure_transitions_total          counter by reason: elected, resigned, lease_expired, session_expired, ownership_lost, closed
//	tenure_campaign_seconds           histogram: how long a successful campaign waited
//	tenure_lease_remaining_seconds    gauge: time until the lease deadline (0 without a session)
//	tenure_suspended                  gauge: 1 while this process leads, renewals fail and the deadline has not passed
//	tenure_session_expirations_total  counter: sessions lost (expired, revoked, or deadline passed)
//	tenure_failover_seconds           histogram: from the observed loss of a leader to the next leader, as this process's watch saw it
//	tenure_lock_wait_seconds          histogram: how long Mutex.Lock waited
//	tenure_skipped_total              counter: TryCampaign and TryLock calls that found the key held
//	tenure_watchdog_failures_total    counter: lease renewals (etcd keep-alives, ZooKeeper pings, Redis watchdog extensions) that failed
//
// Gauges are computed when Prometheus scrapes. A closed Elector's series
// are collected one last time (its final counts: the next scrape, or
// prometheus.WriteToTextfile after Close), then dropped; a new Elector on
// the same key before that collection counts on from them. Create one
// Metrics per registry; it is safe for concurrent use.
type Metrics struct {
	transitions *prometheus.CounterVec
	campaign    *prometheus.HistogramVec
	expirations *prometheus.CounterVec
	failover    *prometheus.HistogramVec
	lockWait    *prometheus.HistogramVec
	watchdog    *prometheus.CounterVec
	skipped     *prometheus.CounterVec

	isLeader, term, leaseRemaining, suspended *prometheus.Desc

	mu       sync.Mutex
	electors map[metricsKey]*Elector
	retired  map[metricsKey]bool // closed; dropped after the next Collect
}

type metricsKey struct{ key, backend string }

// NewMetrics creates the metrics and registers them on reg (never on the
// global registry unless reg is prometheus.DefaultRegisterer). A nil reg is
// an error wrapping tenure.ErrInvalidConfig; so is a reg that already holds
// tenure's metrics (a second NewMetrics on it): share one *Metrics between
// Electors instead.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if isnil.Nil(reg) { // a nil *prometheus.Registry too
		return nil, fmt.Errorf("%w: nil prometheus.Registerer", tenure.ErrInvalidConfig)
	}
	labels := []string{"key", "backend"}
	m := &Metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_transitions_total",
			Help: "Leadership transitions of this process, by reason: elected, resigned, lease_expired, session_expired, ownership_lost, closed.",
		}, append(labels, "reason")),
		campaign: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_campaign_seconds",
			Help:    "How long successful campaigns waited before leading.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, labels),
		expirations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_session_expirations_total",
			Help: "Sessions this process lost: expired or revoked on the server, or abandoned when the lease deadline passed.",
		}, labels),
		failover: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_failover_seconds",
			Help:    "Time from the observed loss of a leader to the next leader, as this process's watch saw it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, labels),
		lockWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tenure_lock_wait_seconds",
			Help:    "How long Mutex.Lock waited for the lock.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, labels),
		watchdog: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_watchdog_failures_total",
			Help: "Lease renewals that failed: etcd keep-alives, ZooKeeper session pings, Redis watchdog extensions. Each failure suspends the leader until a renewal succeeds or the deadline passes.",
		}, labels),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tenure_skipped_total",
			Help: "Campaigns that did not wait (TryCampaign, Mutex.TryLock, tenure exec --no-wait) and found the key held.",
		}, labels),
		isLeader:       prometheus.NewDesc("tenure_is_leader", "1 while this process leads the key, else 0.", labels, nil),
		term:           prometheus.NewDesc("tenure_term", "Fencing token of the term this process holds; 0 when it does not lead.", labels, nil),
		leaseRemaining: prometheus.NewDesc("tenure_lease_remaining_seconds", "Seconds until the lease deadline, after which a leader demotes itself; 0 without a session.", labels, nil),
		suspended:      prometheus.NewDesc("tenure_suspended", "1 while this process leads, its lease renewals fail and the deadline has not passed yet, else 0.", labels, nil),
		electors:       map[metricsKey]*Elector{},
		retired:        map[metricsKey]bool{},
	}
	if err := reg.Register(m); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %w", tenure.ErrInvalidConfig, err)
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.transitions.Describe(ch)
	m.campaign.Describe(ch)
	m.expirations.Describe(ch)
	m.failover.Describe(ch)
	m.lockWait.Describe(ch)
	m.watchdog.Describe(ch)
	m.skipped.Describe(ch)
	ch <- m.isLeader
	ch <- m.term
	ch <- m.leaseRemaining
	ch <- m.suspended
}

// Collect implements prometheus.Collector. It drops the series of the
// Electors closed since the last Collect once it has collected them.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock() // held throughout: add must not start a key's series again in between
	defer m.mu.Unlock()
	m.transitions.Collect(ch)
	m.campaign.Collect(ch)
	m.expirations.Collect(ch)
	m.failover.Collect(ch)
	m.lockWait.Collect(ch)
	m.watchdog.Collect(ch)
	m.skipped.Collect(ch)
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for k, e := range m.electors {
		t, leads := e.Term()
		remaining := 0.0
		if d := e.Deadline(); !d.IsZero() {
			remaining = max(0, d.Sub(e.clock.Now()).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(m.isLeader, prometheus.GaugeValue, b2f(leads), k.key, k.backend)
		ch <- prometheus.MustNewConstMetric(m.term, prometheus.GaugeValue, float64(t.Token), k.key, k.backend)
		ch <- prometheus.MustNewConstMetric(m.leaseRemaining, prometheus.GaugeValue, remaining, k.key, k.backend)
		ch <- prometheus.MustNewConstMetric(m.suspended, prometheus.GaugeValue, b2f(e.Suspended()), k.key, k.backend)
	}
	for k := range m.retired {
		m.dropLocked(k)
	}
}

// add starts reporting e. Two Electors on one key and backend cannot share
// a Metrics (their series would collide).
func (m *Metrics) add(e *Elector) error {
	k := metricsKey{e.cfg.Key, e.b.Name()}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retired[k] {
		// Closed, and not collected since: the new Elector takes over the
		// key's series, and their counts go on from the closed one's.
		delete(m.retired, k)
		m.electors[k] = e
		return nil
	}
	if _, dup := m.electors[k]; dup {
		return fmt.Errorf("%w: metrics: another Elector already reports key %q on %s", tenure.ErrInvalidConfig, k.key, k.backend)
	}
	m.electors[k] = e
	return nil
}

// remove retires e (at Close): the next Collect reports it one last
// time, its final counts, and then drops its key's series. A process that
// locks a key per job, one Elector each, would otherwise keep every key's
// counters and histograms for its whole life. A new Elector on the key
// before that Collect takes the series over and counts on; one after it
// starts them again from zero, which Prometheus's rate() reads as a
// counter reset.
func (m *Metrics) remove(e *Elector) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := metricsKey{e.cfg.Key, e.b.Name()}
	if m.electors[k] == e {
		m.retired[k] = true
	}
}

// dropLocked forgets the retired Elector of k and deletes k's series.
func (m *Metrics) dropLocked(k metricsKey) {
	delete(m.retired, k)
	delete(m.electors, k)
	labels := prometheus.Labels{"key": k.key, "backend": k.backend}
	m.transitions.DeletePartialMatch(labels)
	for _, v := range []*prometheus.CounterVec{m.expirations, m.watchdog, m.skipped} {
		v.Delete(labels)
	}
	for _, v := range []*prometheus.HistogramVec{m.campaign, m.failover, m.lockWait} {
		v.Delete(labels)
	}
}

// reason maps a demotion cause onto the transitions label.
func reason(cause error) string {
	switch {
	case errors.Is(cause, tenure.ErrClosed):
		return "closed"
	case errors.Is(cause, tenure.ErrLeaseExpired):
		return "lease_expired"
	case errors.Is(cause, tenure.ErrSessionExpired):
		return "session_expired"
	case errors.Is(cause, tenure.ErrOwnershipLost):
		return "ownership_lost"
	default:
		return "resigned"
	}
}

// recorder is what an Elector reports through; its methods are no-ops
// without Metrics, and once the Elector's key is no longer its own there:
// closed, and dropped by a Collect since, or taken over by a new Elector on
// the key. (A lease that outlives Close, while Run's work stops, or a
// campaign that returns after it, would otherwise start the dropped series
// again, for good, or count into the new Elector's.) Call its methods
// holding no lock of the Elector or its lease: Collect holds m.mu while it
// reads them.
type recorder struct {
	m            *Metrics
	e            *Elector
	key, backend string
}

// record runs f while e still owns its key's series.
func (r recorder) record(f func(m *Metrics)) {
	if r.m == nil {
		return
	}
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	if r.m.electors[metricsKey{r.key, r.backend}] != r.e {
		return
	}
	f(r.m)
}

func (r recorder) elected(waited time.Duration) {
	r.record(func(m *Metrics) {
		m.transitions.WithLabelValues(r.key, r.backend, "elected").Inc()
		m.campaign.WithLabelValues(r.key, r.backend).Observe(waited.Seconds())
	})
}

func (r recorder) demoted(cause error) {
	r.record(func(m *Metrics) { m.transitions.WithLabelValues(r.key, r.backend, reason(cause)).Inc() })
}

func (r recorder) sessionLost() {
	r.record(func(m *Metrics) { m.expirations.WithLabelValues(r.key, r.backend).Inc() })
}

func (r recorder) skippedHeld() {
	r.record(func(m *Metrics) { m.skipped.WithLabelValues(r.key, r.backend).Inc() })
}

func (r recorder) renewalFailed() {
	r.record(func(m *Metrics) { m.watchdog.WithLabelValues(r.key, r.backend).Inc() })
}

func (r recorder) failover(d time.Duration) {
	r.record(func(m *Metrics) { m.failover.WithLabelValues(r.key, r.backend).Observe(d.Seconds()) })
}

func (r recorder) lockWait(d time.Duration) {
	r.record(func(m *Metrics) { m.lockWait.WithLabelValues(r.key, r.backend).Observe(d.Seconds()) })
}

// init creates the label series at zero, so dashboards see them before the
// first event.
func (r recorder) init() {
	r.record(func(m *Metrics) {
		for _, why := range []string{"elected", "resigned", "lease_expired", "session_expired", "ownership_lost", "closed"} {
			m.transitions.WithLabelValues(r.key, r.backend, why)
		}
		m.expirations.WithLabelValues(r.key, r.backend)
		m.watchdog.WithLabelValues(r.key, r.backend)
		m.skipped.WithLabelValues(r.key, r.backend)
	})
}
