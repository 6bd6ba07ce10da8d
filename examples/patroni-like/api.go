package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Status is what a member reports about itself (GET /status), and the
// entries of GET /cluster.
type Status struct {
	// Name is the member's name.
	Name string `json:"name"`
	// Role is one of the Role constants ("primary", "replica", ...), or
	// "unreachable" in /cluster when the member did not answer.
	Role string `json:"role"`
	// Term is the fencing token of the member's term while it is elected.
	Term uint64 `json:"term,omitempty"`
	// Leader is the member the leader key names, as this member last saw
	// it ("" when vacant).
	Leader string `json:"leader,omitempty"`
	// API and Postgres are the member's addresses.
	API      string `json:"api"`
	Postgres string `json:"postgres"`
	// Running reports whether its PostgreSQL answers queries.
	Running bool `json:"running"`
	// InRecovery reports whether its PostgreSQL is a standby.
	InRecovery bool `json:"in_recovery"`
	// ReadOnly reports default_transaction_read_only.
	ReadOnly bool `json:"read_only"`
	// Streaming reports whether a standby's WAL receiver streams.
	Streaming bool `json:"streaming,omitempty"`
	// Upstream is the address a standby streams from.
	Upstream string `json:"upstream,omitempty"`
	// LSN is the primary's current WAL position, or the standby's replay
	// position.
	LSN string `json:"lsn,omitempty"`
	// ReceivedLSN is, on a standby, the WAL it would have replayed once
	// promoted: the greater of what it received and what it replayed
	// (pg_promote replays everything received first). Empty on a primary.
	ReceivedLSN string `json:"received_lsn,omitempty"`
	// Candidate reports whether the member stands for election now.
	Candidate bool `json:"candidate,omitempty"`
	// Ineligible says why a running standby does not stand for election
	// (further behind the primary's last recorded position than
	// dcs.maximum_lag_on_failover); empty when it may.
	Ineligible string `json:"ineligible,omitempty"`
	// Timeline is the primary's current timeline (from its WAL position's
	// file name), or a standby's: the newest it knows of, from the WAL it
	// receives, the timeline history files in its pg_wal (a standby that
	// followed a promotion, or was rewound onto it, has the new one's)
	// and its last restartpoint, which can lag a switch by minutes.
	Timeline int `json:"timeline,omitempty"`
	// Lag is, in /cluster, how many bytes of WAL a standby has yet to
	// replay, compared with the primary's position.
	Lag *int64 `json:"lag,omitempty"`
	// Error is the last error of the member's loop, if any.
	Error string `json:"error,omitempty"`

	err error
}

// Cluster is the body of GET /cluster.
type Cluster struct {
	// Scope is the cluster's scope.
	Scope string `json:"scope"`
	// Leader is the member leading, as the member that answers sees it.
	Leader string `json:"leader,omitempty"`
	// Term is the leader's term.
	Term uint64 `json:"term,omitempty"`
	// Members lists every configured member, in configuration order.
	Members []Status `json:"members"`
}

// queryStatus asks the local PostgreSQL for its state.
func (m *Manager) queryStatus(ctx context.Context) Status {
	self := m.cfg.Self()
	m.mu.Lock()
	st := Status{Name: m.cfg.Name, Role: m.role, API: self.API, Postgres: self.Postgres, Upstream: m.upstream, Error: m.lastErr}
	if m.elected {
		st.Term = m.term.Token
	}
	st.Candidate, st.Ineligible = m.runCancel != nil, m.ineligible
	if m.observed && !m.leader.Vacant {
		st.Leader = m.leader.Term.Identity
	}
	m.mu.Unlock()
	if !m.pg.Running() {
		if st.Role == RoleReplica || st.Role == RolePrimary {
			st.Role = RoleStopped
		}
		st.err = fmt.Errorf("PostgreSQL is not running")
		return st
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := m.pg.Connect(ctx)
	if err != nil {
		st.err = err
		return st
	}
	defer conn.Close(context.Background())
	var ro string
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only'),
		CASE WHEN pg_is_in_recovery() THEN coalesce(pg_last_wal_replay_lsn()::text, '') ELSE pg_current_wal_lsn()::text END,
		CASE WHEN pg_is_in_recovery()
			THEN greatest(
				(SELECT max(received_tli) FROM pg_stat_wal_receiver),
				(SELECT max(('x' || substr(name, 1, 8))::bit(32)::int) FROM pg_ls_waldir() WHERE name ~ '^[0-9A-F]{8}\.history$'),
				(SELECT timeline_id FROM pg_control_checkpoint()))
			ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
		coalesce((SELECT status = 'streaming' FROM pg_stat_wal_receiver LIMIT 1), false),
		CASE WHEN pg_is_in_recovery()
			THEN coalesce(greatest(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text, '') ELSE '' END`).
		Scan(&st.InRecovery, &ro, &st.LSN, &st.Timeline, &st.Streaming, &st.ReceivedLSN)
	if err != nil {
		st.err = err
		return st
	}
	st.Running, st.ReadOnly = true, ro == "on"
	return st
}

// isPrimary reports whether st describes a member that accepts writes under
// its term: elected, promoted, recorded, open.
func (st Status) isPrimary() bool {
	return st.Role == RolePrimary && st.Running && !st.InRecovery && !st.ReadOnly && st.Term != 0
}

// Handler is the REST API, as Patroni's:
//
//	GET /primary  200 only on the primary open for writes (HAProxy's check
//	              for the read-write port); the body is the Status, with
//	              the term, also in the X-Tenure-Term header
//	GET /replica  200 only on a standby that streams from the primary
//	GET /health   200 when PostgreSQL runs, whatever its role
//	GET /status   this member's Status
//	GET /cluster  every member's Status, with replication lag (Cluster)
//
// It is safe for concurrent use.
func (m *Manager) Handler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, ok bool, v any) {
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /primary", func(w http.ResponseWriter, r *http.Request) {
		st := m.queryStatus(r.Context())
		ok := st.isPrimary() && m.e.IsLeader()
		if ok {
			w.Header().Set("X-Tenure-Term", strconv.FormatUint(st.Term, 10))
		}
		reply(w, ok, st)
	})
	mux.HandleFunc("GET /replica", func(w http.ResponseWriter, r *http.Request) {
		st := m.queryStatus(r.Context())
		reply(w, st.Role == RoleReplica && st.Running && st.InRecovery && st.Streaming, st)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		st := m.queryStatus(r.Context())
		reply(w, st.Running, st)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		reply(w, true, m.queryStatus(r.Context()))
	})
	mux.HandleFunc("GET /cluster", func(w http.ResponseWriter, r *http.Request) {
		reply(w, true, m.cluster(r.Context()))
	})
	return mux
}

// cluster gathers every member's status (its own directly, the others'
// through their /status) and computes the standbys' lag.
func (m *Manager) cluster(ctx context.Context) Cluster {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	out := Cluster{Scope: m.cfg.Scope, Members: make([]Status, len(m.cfg.Members))}
	var wg sync.WaitGroup
	for i, mem := range m.cfg.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if mem.Name == m.cfg.Name {
				out.Members[i] = m.queryStatus(ctx)
				return
			}
			st, err := fetchStatus(ctx, mem.API)
			if err != nil {
				st = Status{Name: mem.Name, Role: "unreachable", API: mem.API, Postgres: mem.Postgres, Error: err.Error()}
			}
			out.Members[i] = st
		}()
	}
	wg.Wait()
	var primaryLSN uint64
	for _, st := range out.Members {
		if st.isPrimary() {
			out.Leader, out.Term = st.Name, st.Term
			primaryLSN, _ = parseLSN(st.LSN)
		}
	}
	for i, st := range out.Members {
		if st.InRecovery && primaryLSN != 0 {
			if lsn, ok := parseLSN(st.LSN); ok {
				lag := int64(primaryLSN) - int64(lsn)
				out.Members[i].Lag = &lag
			}
		}
	}
	return out
}

// fetchStatus reads a member's GET /status.
func fetchStatus(ctx context.Context, api string) (Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+api+"/status", nil)
	if err != nil {
		return Status{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Status{}, err
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return Status{}, fmt.Errorf("GET /status: %w", err)
	}
	return st, nil
}

// parseLSN parses PostgreSQL's "X/Y" WAL position.
func parseLSN(s string) (uint64, bool) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, false
	}
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return h<<32 | l, true
}
