package election

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tenure-go/tenure/internal/isnil"
)

// Status is a snapshot of an Elector, as /status reports it: a plain value,
// safe to copy and encode, that does not change after Status returns it.
type Status struct {
	// State is "leader", "suspended" (leading while renewals fail),
	// "campaigning" (a Campaign or Run is in progress, whether or not it
	// has an entry in the queue yet), "idle" or "closed".
	State string `json:"state"`
	// Key is the election key.
	Key string `json:"key"`
	// Identity is this elector's identity (Config.Identity, defaults
	// applied).
	Identity string `json:"identity"`
	// Backend is the backend's name (Backend.Name).
	Backend string `json:"backend"`
	// Term is the fencing token of the term this process holds, or 0.
	Term uint64 `json:"term"`
	// Leader is the key's leader as the backend reports it now (omitted
	// when it could not be read).
	Leader *LeaderStatus `json:"leader,omitempty"`
	// Deadline is the lease deadline (zero without a live session).
	Deadline time.Time `json:"deadline,omitzero"`
	// LeaseRemainingSeconds is the time until Deadline, 0 once passed.
	LeaseRemainingSeconds float64 `json:"lease_remaining_seconds"`
	// Position is how many candidates are ahead while campaigning with an
	// entry in the queue (0 once first, about to lead), -1 otherwise (the
	// leader, idle, closed, or a campaign that has no entry yet).
	Position int `json:"position"`
	// Wedged explains why /healthz fails, or is empty.
	Wedged string `json:"wedged,omitempty"`
}

// LeaderStatus is the observed leader in a Status; a plain value.
type LeaderStatus struct {
	// Vacant is true when nobody holds the key.
	Vacant bool `json:"vacant"`
	// Identity is the holder's identity; empty when Vacant.
	Identity string `json:"identity,omitempty"`
	// Term is the holder's fencing token; 0 when Vacant.
	Term uint64 `json:"term,omitempty"`
}

// Status reads the elector's state; it asks the backend for the leader and
// the queue position, on ctx (context.Background when nil).
func (e *Elector) Status(ctx context.Context) Status {
	if ctx == nil {
		ctx = context.Background()
	}
	st := Status{Key: e.cfg.Key, Identity: e.cfg.Identity, Backend: e.b.Name(), Position: -1}
	e.mu.Lock()
	closed, pending := e.closed, e.pending != nil
	e.mu.Unlock()
	// A Campaign or Run in progress without an entry yet (opening its
	// session, waiting to retry after a failure) is campaigning too.
	trying := len(e.campaignSem) > 0 || len(e.runSem) > 0
	t, leads := e.Term()
	switch {
	case closed:
		st.State = "closed"
	case leads && e.Suspended():
		st.State = "suspended"
	case leads:
		st.State = "leader"
	case pending || trying:
		st.State = "campaigning"
	default:
		st.State = "idle"
	}
	st.Term = t.Token
	if d := e.Deadline(); !d.IsZero() {
		st.Deadline = d
		st.LeaseRemainingSeconds = max(0, d.Sub(e.clock.Now()).Seconds())
	}
	if l, err := e.Leader(ctx); err == nil {
		st.Leader = &LeaderStatus{Vacant: l.Vacant, Identity: l.Term.Identity, Term: l.Term.Token}
	}
	if pending && !leads {
		if n, err := e.Position(ctx); err == nil {
			st.Position = n
		}
	}
	st.Wedged = e.wedged()
	return st
}

// wedged explains why this process is unhealthy: it believes it leads past
// its lease deadline (the demotion did not happen), or its elected work
// still runs StopTimeout after its term ended. Empty when healthy.
func (e *Elector) wedged() string {
	e.mu.Lock()
	ld := e.lead
	var ended time.Time
	var workRunning bool
	if ld != nil {
		ended = ld.ended
		if ld.work != nil {
			select {
			case <-ld.work:
			default:
				workRunning = true
			}
		}
	}
	e.mu.Unlock()
	if ld == nil {
		return ""
	}
	now := e.clock.Now()
	if ld.ctx.Err() == nil && now.After(ld.lease.Deadline().Add(e.cfg.StopTimeout)) {
		return "believes it leads past its lease deadline"
	}
	if workRunning && !ended.IsZero() && now.Sub(ended) > e.cfg.StopTimeout {
		return "elected work still runs after its term ended"
	}
	return ""
}

// Handler serves HTTP endpoints for load balancers, supervisors and
// Prometheus:
//
//	/healthz  200, or 503 when this process believes it leads more than
//	          Config.StopTimeout past its lease deadline, or its elected
//	          work outlived its term by StopTimeout (restart it)
//	/leader   200 on the leader, 503 elsewhere (as Patroni's /primary, for
//	          HAProxy and load balancers)
//	/status   JSON Status; reading the leader waits up to 5 s for an
//	          unreachable backend (the other paths read local state only)
//	/metrics  the metrics g gathers (omitted when g is nil)
//
// It is safe for concurrent use.
func (e *Elector) Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if why := e.wedged(); why != "" {
			http.Error(w, "unhealthy: "+why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/leader", func(w http.ResponseWriter, r *http.Request) {
		if t, ok := e.Term(); ok {
			w.Header().Set("X-Tenure-Term", strconv.FormatUint(t.Token, 10))
			_, _ = w.Write([]byte("leader\n"))
			return
		}
		http.Error(w, "not leader", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(e.Status(ctx))
	})
	if !isnil.Nil(g) {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	return mux
}
