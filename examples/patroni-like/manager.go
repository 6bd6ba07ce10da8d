package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/alarmpipe"
)

// Roles a member reports.
const (
	RoleStarting  = "starting"      // no decision yet: waiting to see the leader key
	RoleUninit    = "uninitialized" // no data directory, and nobody to copy one from
	RoleReplica   = "replica"       // a standby, in recovery
	RolePromoting = "promoting"     // elected; promoting and recording the term
	RolePrimary   = "primary"       // elected, term recorded, open for writes
	RoleFencing   = "fencing"       // term ended; PostgreSQL shutting down, no session left
	RoleFenced    = "fenced"        // was primary; PostgreSQL stopped, waiting to rejoin
	RoleStopped   = "stopped"       // PostgreSQL not running
	RoleForeign   = "foreign-data"  // the data directory is another cluster's: never started, never promoted
)

// Manager keeps one PostgreSQL instance in the role the election gives it:
// primary while its member leads the leader key, streaming standby of the
// leader otherwise. Create it with NewManager and call Run once.
//
// Its methods are safe for concurrent use.
type Manager struct {
	cfg Config
	log *zap.Logger
	pg  *Postgres
	cli *clientv3.Client
	e   *election.Elector

	kick chan struct{} // wakes the loop early

	// pgLock, a one-slot semaphore, is held while the loop or the elected
	// work changes PostgreSQL (a channel, so that the elected work can stop
	// waiting for it when its term ends).
	pgLock chan struct{}

	mu            sync.Mutex
	role          string
	term          tenure.Term   // while elected
	elected       bool          // OnElected is running
	leader        tenure.Leader // as last observed
	observed      bool          // leader holds a real observation
	upstream      string        // the primary_conninfo address written last
	upstreamSince time.Time     // when the upstream was set and not yet seen streaming
	rewindFails   int
	needRewind    bool // this member was primary; it may stream only after pg_rewind
	checkedData   bool // needRewind was read from the data directory at start
	promoting     bool // this term issued pg_promote: the data may diverge from the old timeline
	lastErr       string
	ineligible    string             // why this standby stands not for election ("": it may)
	runCancel     context.CancelFunc // cancels the election's Run; nil when not campaigning
	runDone       chan struct{}

	fatal chan error // an error no retry can fix (a TTL the server refuses): Run returns it

	dog *watchdog // nil when it could not start (see Run)
}

// NewManager connects (lazily) to the DCS and prepares the manager of cfg.
// log receives every log line; the lines that carry an "event" field
// (elected, yield, promoting, open, fenced, demoted, replica, bootstrap,
// rewind, restart, ineligible, eligible) are the history that the demo
// and the tests read.
func NewManager(cfg Config, log *zap.Logger) (*Manager, error) {
	pg, err := NewPostgres(cfg)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.DCS.Endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		// A member that goes silent (no reset) is found dead only by
		// pings: without them a standby whose watches ran on it would
		// never see the primary's key go (docs/etcd.md).
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	ecfg := election.Config{Key: cfg.LeaderKey(), Identity: cfg.Name, TTL: cfg.DCS.TTL}.WithDefaults()
	// The fence's clean shutdown (drainFor) gets most of the margin that
	// tenure leaves between the lease deadline and the server's earliest
	// expiry: three quarters instead of half.
	ecfg.StopTimeout = ecfg.DeadlineMargin * 3 / 4
	e, err := election.New(etcdelect.New(cli), ecfg, election.WithLogger(log))
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &Manager{cfg: cfg, log: log.With(zap.String("node", cfg.Name)), pg: pg, cli: cli, e: e,
		kick: make(chan struct{}, 1), pgLock: make(chan struct{}, 1), role: RoleStarting, fatal: make(chan error, 1)}, nil
}

func (m *Manager) event(name string, fields ...zap.Field) {
	m.log.Info(name, append(fields, zap.String("event", name))...)
}

func (m *Manager) wake() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

func (m *Manager) setRole(r string) {
	m.mu.Lock()
	m.role = r
	m.mu.Unlock()
}

// Run serves the REST API, watches the leader key and runs the loop until
// ctx ends; then it fences and stops PostgreSQL, resigns, and returns nil
// once everything it started has stopped. It returns an error when the API
// cannot listen.
func (m *Manager) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", m.cfg.Self().API)
	if err != nil {
		m.e.Close(context.Background()) //nolint:errcheck // nothing was started
		m.cli.Close()
		return fmt.Errorf("rest api: %w", err)
	}
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln) // returns at Shutdown
	}()
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	go func() {
		defer wg.Done()
		for l := range m.e.Observe(octx) {
			m.mu.Lock()
			m.leader, m.observed = l, true
			m.mu.Unlock()
			m.log.Info("leader observed", zap.Stringer("leader", l))
			m.wake()
		}
	}()
	if m.dog, err = startWatchdog(); err != nil {
		m.log.Warn("no watchdog: a primary whose manager is stopped keeps accepting commits past its lease", zap.Error(err))
	}
	defer m.dog.close()
	m.event("started", zap.String("api", m.cfg.Self().API), zap.String("postgres", m.pg.Addr()))

	t := time.NewTicker(m.cfg.DCS.LoopWait)
	var fatal error
	for ctx.Err() == nil && fatal == nil {
		m.step(ctx)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-m.kick:
		case fatal = <-m.fatal:
			m.log.Error("stopping: the election cannot run", zap.Error(fatal))
			stopObserving()
		}
	}
	t.Stop()

	// Shut down: the election first (the elected work fences PostgreSQL,
	// then the key is released), then PostgreSQL, the API and the client.
	m.stopCampaign()
	m.pgLock <- struct{}{}
	m.pg.Stop(10 * time.Second)
	<-m.pgLock
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	_ = m.e.Close(context.Background())
	wg.Wait()
	m.cli.Close()
	m.event("stopped")
	if fatal != nil {
		return fmt.Errorf("election: %w", fatal)
	}
	return nil
}

// leaderElsewhere returns the member that leads, when another member does.
func (m *Manager) leaderElsewhere() (Member, bool) {
	m.mu.Lock()
	l, ok := m.leader, m.observed
	m.mu.Unlock()
	if !ok || l.Vacant || l.Term.Identity == m.cfg.Name {
		return Member{}, false
	}
	return m.cfg.Member(l.Term.Identity)
}

// step is one pass of the loop (Patroni's HA cycle): it brings PostgreSQL to
// the state the election asks for, when this member does not lead.
func (m *Manager) step(ctx context.Context) {
	// A member stands only while its PostgreSQL runs as a standby: one
	// whose PostgreSQL is down leaves the queue before the pass repairs
	// it (a rewind, a copy or a recovery may take long; elected meanwhile,
	// it would hold the key with no primary). Before taking pgLock: the
	// elected work, which stopCampaign waits for, may be waiting for it.
	if !m.pg.Running() {
		m.stopCampaign()
	}
	m.pgLock <- struct{}{}
	m.mu.Lock()
	elected, observed := m.elected, m.observed
	m.mu.Unlock()
	if elected || !observed {
		<-m.pgLock
		return // the elected work owns PostgreSQL; or the key has not been read yet
	}
	err := m.converge(ctx)
	<-m.pgLock // before stopCampaign, which waits for elected work that takes it
	m.mu.Lock()
	if err != nil {
		m.lastErr = err.Error()
	} else {
		m.lastErr = ""
	}
	m.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		m.log.Warn("loop", zap.Error(err))
	}
	// Campaign only with a running standby: a member without data, or whose
	// data has not been rewound onto the current primary's history, must not
	// be promoted.
	if err == nil && m.pg.Running() && ctx.Err() == nil && m.eligible(ctx) {
		m.startCampaign(ctx)
	} else {
		m.stopCampaign()
	}
}

func (m *Manager) converge(ctx context.Context) error {
	leader, elsewhere := m.leaderElsewhere()
	opCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if !m.checkedData && m.pg.HasData() && !m.pg.Running() {
		// A former primary may have WAL that no other member has: it
		// must rewind onto any member promoted after it (see the
		// needRewind cases below). Its control file says so until it
		// runs as a standby; the mark, until it is rewound.
		was, err := m.pg.WasPrimary(opCtx)
		if err != nil {
			return err
		}
		was = was || m.pg.MarkedNeedsRewind()
		m.setNeedRewind(was)
		m.mu.Lock()
		m.checkedData = true
		m.mu.Unlock()
	}
	m.mu.Lock()
	needRewind := m.needRewind
	m.mu.Unlock()
	if m.pg.HasData() && !m.pg.Running() {
		// Data of another cluster (a directory restored from elsewhere, a
		// member that ran initdb on its own) must never run here: once
		// promoted, every other member would copy it over theirs. Checked
		// before every start (PostgreSQL runs only once it passed).
		if err := m.checkClusterID(opCtx); err != nil {
			if errors.Is(err, errForeignData) {
				m.mu.Lock()
				told := m.role == RoleForeign
				m.role = RoleForeign
				m.mu.Unlock()
				if !told {
					m.event("foreign-data", zap.Error(err))
				}
			}
			return err
		}
	}
	switch {
	case !m.pg.HasData() && elsewhere:
		m.setRole(RoleUninit)
		if !Promoted(opCtx, leader.Postgres) {
			return nil // the leader is still promoting: copy it once it is a primary
		}
		m.event("basebackup", zap.String("from", leader.Name))
		if err := m.pg.BaseBackup(opCtx, leader.Postgres); err != nil {
			return err
		}
		m.setNeedRewind(false) // a mark left by data that is gone
		return m.startStandby(opCtx, leader)

	case !m.pg.HasData():
		m.setRole(RoleUninit)
		won, err := m.claimInitialize(opCtx)
		if err != nil || !won {
			return err // another member bootstraps; wait for it to lead
		}
		m.event("bootstrap")
		if err := m.pg.Initdb(opCtx); err != nil {
			return err
		}
		m.setNeedRewind(false)
		// A new cluster starts as a standby without upstream, like every
		// member: only the elected work promotes.
		return m.startStandby(opCtx, Member{})

	case !m.pg.Running() && elsewhere:
		// A former primary (or a standby that fell off the new primary's
		// history) rewinds onto the leader's timeline; pg_rewind is a no-op
		// when nothing diverged. After repeated failures, copy afresh. Not
		// before the leader is promoted: until then its timeline is the
		// old one, and rewinding onto that would leave this member's
		// divergence in place.
		if !Promoted(opCtx, leader.Postgres) {
			return nil
		}
		if !needRewind {
			// A standby that did not shut down cleanly (killed, its host
			// crashed) recovers as a standby, replaying only what a
			// primary sent. pg_rewind would run its crash recovery
			// outside standby mode, which writes checkpoint records of
			// its own that the primary never had: the first WAL streamed
			// from the primary overwrites them, and replay stops for
			// good. If its history went past the primary's fork point,
			// it will not stream; the check below stops it cleanly after
			// a while, and the next pass rewinds it then, with no crash
			// recovery to run.
			crashed, err := m.pg.CrashedStandby(opCtx)
			if err != nil {
				return err
			}
			if crashed {
				m.event("recover", zap.String("why", "a standby that did not shut down cleanly recovers as a standby"))
				return m.startStandby(opCtx, leader)
			}
		}
		m.event("rewind", zap.String("from", leader.Name))
		if err := m.pg.Rewind(opCtx, leader.Postgres); err != nil {
			m.rewindFails++
			if m.rewindFails < 3 {
				return err
			}
			m.event("basebackup", zap.String("from", leader.Name), zap.NamedError("after", err))
			if err := m.pg.BaseBackup(opCtx, leader.Postgres); err != nil {
				return err
			}
		}
		m.rewindFails = 0
		m.setNeedRewind(false)
		return m.startStandby(opCtx, leader)

	case !m.pg.Running() && needRewind:
		// A former primary waits for a primary to rewind onto, unless it
		// was promoted last itself (its term ended, say, because
		// PostgreSQL died): then its data is the newest, and it runs, and
		// stands, as a standby. It still needs the rewind (needRewind
		// stays): a member promoted next may not have had all its WAL.
		last, err := m.promotedLast(opCtx)
		if err != nil || !last {
			m.setRole(RoleFenced)
			return err
		}
		return m.startStandby(opCtx, Member{})

	case !m.pg.Running():
		// Nobody else leads (or we cannot tell, being cut off): run as a
		// standby without upstream, read-only, eligible for promotion.
		return m.startStandby(opCtx, Member{})
	}

	// Running. It must be a standby: only the elected work promotes, and it
	// stops PostgreSQL when the term ends.
	st := m.queryStatus(opCtx)
	if st.err != nil {
		return st.err
	}
	if !st.InRecovery {
		m.pg.Stop(0)
		m.event("fenced", zap.String("why", "running as a primary without a term"))
		return nil
	}
	if needRewind {
		// A former primary running on its own data: once another member
		// is promoted, it must stop and rewind onto it before it streams,
		// or stands, again.
		last := false
		if !elsewhere {
			var err error
			if last, err = m.promotedLast(opCtx); err != nil {
				return err
			}
		}
		if !last {
			why := "another member was promoted after it: rewind onto its timeline"
			m.pg.Stop(10 * time.Second)
			m.setRole(RoleFenced)
			m.event("restart", zap.String("why", why))
			return nil
		}
	}
	m.setRole(RoleReplica)
	want := ""
	if elsewhere {
		want = leader.Postgres
	}
	m.mu.Lock()
	have, since := m.upstream, m.upstreamSince
	m.mu.Unlock()
	if have != want {
		if err := m.pg.Configure(want, true); err != nil {
			return err
		}
		if err := m.pg.Reload(); err != nil {
			return err
		}
		m.setUpstream(want)
		m.event("replica", zap.String("upstream", leader.Name), zap.String("change", "primary_conninfo reloaded"))
		return nil
	}
	if want != "" && !st.Streaming {
		// Not streaming from the new primary after a while: this standby's
		// history probably went past the fork point. Stop it; the next pass
		// rewinds it.
		if !since.IsZero() && time.Since(since) > max(10*m.cfg.DCS.LoopWait, 10*time.Second) {
			m.event("restart", zap.String("why", "not streaming from "+leader.Name))
			m.pg.Stop(10 * time.Second)
		}
		return nil
	}
	if st.Streaming {
		m.mu.Lock()
		m.upstreamSince = time.Time{}
		m.mu.Unlock()
	}
	return nil
}

// setNeedRewind sets needRewind, and the mark that keeps it across a
// restart of the manager (Postgres.MarkNeedsRewind).
func (m *Manager) setNeedRewind(on bool) {
	m.mu.Lock()
	m.needRewind = on
	m.mu.Unlock()
	if err := m.pg.MarkNeedsRewind(on); err != nil {
		m.log.Warn("needs-rewind mark", zap.Bool("on", on), zap.Error(err))
	}
}

func (m *Manager) setUpstream(addr string) {
	m.mu.Lock()
	m.upstream, m.upstreamSince = addr, time.Now()
	m.mu.Unlock()
}

// startStandby writes the standby settings (streaming from leader, or from
// nobody when leader is zero) and starts PostgreSQL in recovery.
func (m *Manager) startStandby(ctx context.Context, leader Member) error {
	if err := m.pg.Configure(leader.Postgres, true); err != nil {
		return err
	}
	if err := m.pg.SetStandby(true); err != nil {
		return err
	}
	if err := m.pg.Start(ctx); err != nil {
		return err
	}
	m.setUpstream(leader.Postgres)
	m.setRole(RoleReplica)
	m.event("replica", zap.String("upstream", leader.Name))
	return nil
}

// claimInitialize races for the bootstrap key (Patroni's /initialize): the
// member that creates it runs initdb; the others copy its data once it
// leads. A member that claimed it and failed before its cluster was first
// promoted claims it again. Once the first primary has recorded the
// cluster's system identifier in the key (recordClusterID), nobody runs
// initdb again: a member that comes back without data, the bootstrapper
// included, waits for a leader to copy, for a new cluster would be
// promoted over the real one's data.
func (m *Manager) claimInitialize(ctx context.Context) (bool, error) {
	key := m.cfg.InitializeKey()
	resp, err := m.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, m.cfg.Name)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("claim %s: %w", key, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	return len(kvs) == 1 && string(kvs[0].Value) == m.cfg.Name, nil
}

// errForeignData: the data directory belongs to another cluster.
var errForeignData = errors.New("the data directory belongs to another cluster")

// recordedClusterID reads the cluster's system identifier from the
// bootstrap key, "<bootstrapper> <identifier>" once a primary has recorded
// it (recordClusterID); "" before. It also returns the key's value and mod
// revision.
func (m *Manager) recordedClusterID(ctx context.Context) (id, value string, rev int64, err error) {
	key := m.cfg.InitializeKey()
	r, err := m.cli.Get(ctx, key)
	if err != nil {
		return "", "", 0, fmt.Errorf("read %s: %w", key, err)
	}
	if len(r.Kvs) == 0 {
		return "", "", 0, nil
	}
	value, rev = string(r.Kvs[0].Value), r.Kvs[0].ModRevision
	_, id, _ = strings.Cut(value, " ")
	return id, value, rev, nil
}

// checkClusterID compares the data directory's system identifier with the
// one recorded in the bootstrap key, and fails with errForeignData when
// they differ. Before one is recorded there is nothing to compare.
func (m *Manager) checkClusterID(ctx context.Context) error {
	known, _, _, err := m.recordedClusterID(ctx)
	if err != nil || known == "" {
		return err
	}
	id, err := m.pg.SystemID(ctx)
	if err != nil {
		return err
	}
	if id != known {
		return fmt.Errorf("%w: its system identifier is %s, the cluster's (%s) is %s", errForeignData, id, m.cfg.InitializeKey(), known)
	}
	return nil
}

// recordClusterID records the new primary's system identifier in the
// bootstrap key when it holds none yet (Patroni does the same): the first
// promotion of a new cluster, or a key written before identifiers were
// recorded. From then on nobody runs initdb, and data with another
// identifier never runs (checkClusterID). It fails, failing the
// promotion, when the key holds another identifier.
func (m *Manager) recordClusterID(ctx context.Context) error {
	id, err := m.pg.SystemID(ctx)
	if err != nil {
		return err
	}
	for {
		known, value, rev, err := m.recordedClusterID(ctx)
		switch {
		case err != nil:
			return err
		case known == id:
			return nil
		case known != "":
			return fmt.Errorf("%w: this primary's system identifier is %s, the cluster's (%s) is %s", errForeignData, id, m.cfg.InitializeKey(), known)
		}
		key := m.cfg.InitializeKey()
		if value == "" {
			value = m.cfg.Name
		}
		resp, err := m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).
			Then(clientv3.OpPut(key, value+" "+id)).
			Commit()
		if err != nil {
			return fmt.Errorf("record the cluster's identifier in %s: %w", key, err)
		}
		if resp.Succeeded {
			m.event("cluster-id", zap.String("system_identifier", id))
			return nil
		}
	}
}

// promotedLast reports whether /last-primary names this member: no other
// member has been promoted since it was.
func (m *Manager) promotedLast(ctx context.Context) (bool, error) {
	r, err := m.cli.Get(ctx, m.cfg.LastPrimaryKey())
	if err != nil {
		return false, fmt.Errorf("read %s: %w", m.cfg.LastPrimaryKey(), err)
	}
	return len(r.Kvs) == 1 && string(r.Kvs[0].Value) == m.cfg.Name, nil
}

// startCampaign runs the election in the background unless it runs.
func (m *Manager) startCampaign(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.runCancel != nil {
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	m.runCancel, m.runDone = cancel, done
	m.log.Info("campaigning", zap.String("key", m.cfg.LeaderKey()))
	go func() {
		defer func() {
			m.mu.Lock()
			if m.runDone == done {
				m.runCancel, m.runDone = nil, nil
			}
			m.mu.Unlock()
			close(done)
		}()
		err := m.e.Run(rctx, tenure.Callbacks{
			OnElected:  m.lead,
			OnDemoted:  m.demoted,
			OnHardStop: m.hardStop,
		})
		if err != nil && !errors.Is(err, tenure.ErrCanceled) && !errors.Is(err, tenure.ErrClosed) {
			m.log.Error("election stopped", zap.Error(err))
		}
		if errors.Is(err, tenure.ErrInvalidConfig) {
			// Refused by the server (a TTL under etcd's minimum lease):
			// campaigning again would be refused again, and no member
			// would ever be promoted.
			select {
			case m.fatal <- err:
			default:
			}
		}
	}()
}

// stopCampaign withdraws from the election and waits for Run to return. It
// must not be called from the elected work's goroutine.
func (m *Manager) stopCampaign() {
	m.mu.Lock()
	cancel, done := m.runCancel, m.runDone
	m.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	m.mu.Lock()
	if m.runDone == done {
		m.runCancel, m.runDone = nil, nil
	}
	m.mu.Unlock()
}

// lead is OnElected: promote, record the term in the fence table, open for
// writes, and lead until ctx ends; then fence at once.
func (m *Manager) lead(ctx context.Context, term tenure.Term) {
	m.mu.Lock()
	m.elected, m.term, m.role = true, term, RolePromoting
	m.mu.Unlock()
	m.event("elected", zap.Uint64("term", term.Token))
	stopBackstop := m.backstop()
	yielded := false
	defer func() {
		defer stopBackstop()
		if yielded {
			// Nothing was changed: PostgreSQL is still a standby of the
			// old timeline, with nothing to fence. The term ends
			// (Run resigns) and the member queues again, behind the one
			// that has more WAL.
			m.mu.Lock()
			m.elected, m.role = false, RoleReplica
			m.mu.Unlock()
			m.wake()
			return
		}
		cause := context.Cause(ctx)
		m.setRole(RoleFencing)
		began := time.Now()
		drained := m.pg.Fence(m.drainFor(cause))
		m.mu.Lock()
		// Only a member that promoted may have diverged: one whose
		// promotion never began is still a standby of the old timeline.
		m.elected, m.role = false, RoleFenced
		m.needRewind = m.needRewind || m.promoting
		m.promoting = false
		m.mu.Unlock()
		m.event("fenced", zap.Uint64("term", term.Token), zap.NamedError("cause", cause),
			zap.Bool("drained", drained), zap.Duration("took", time.Since(began)))
		m.wake()
	}()
	if err := m.promote(ctx, term); err != nil {
		var y *yieldError
		if errors.As(err, &y) {
			yielded = true
			m.event("yield", zap.Uint64("term", term.Token), zap.String("to", y.to),
				zap.String("lsn", y.own), zap.String("their_lsn", y.theirs), zap.String("reason", y.why))
			return
		}
		m.log.Error("promotion failed; resigning", zap.Uint64("term", term.Token), zap.Error(err))
		return
	}
	m.mu.Lock()
	m.role = RolePrimary
	m.mu.Unlock()
	m.event("open", zap.Uint64("term", term.Token))
	m.recordOptime(ctx, term)
	t := time.NewTicker(m.cfg.DCS.LoopWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !m.pg.Running() {
				m.log.Error("PostgreSQL died while primary; resigning", zap.Uint64("term", term.Token))
				return
			}
			m.recordOptime(ctx, term)
		}
	}
}

// backstop keeps the watchdog armed while this member leads: every
// sixteenth of the deadline margin it reads the lease deadline and the
// postmaster's pid, and when either moved it arms the watchdog to kill
// PostgreSQL at the deadline plus 7/8 of the margin: after the fence,
// which ends within 3/4 of it (see drainFor), and before the server can
// expire the lease (the deadline plus the margin). A renewal reaches the
// watchdog long before the instant it replaces. The returned func stops
// it and disarms the watchdog; call it once the fence is done.
func (m *Manager) backstop() (stop func()) {
	if m.dog == nil {
		return func() {}
	}
	margin := m.e.Config().DeadlineMargin
	after := margin * 7 / 8
	var sent time.Time
	sentPID := 0
	stopArming := alarmpipe.Every(max(margin/16, 10*time.Millisecond), func() bool {
		if d, pid := m.e.Deadline(), m.pg.PID(); !d.IsZero() && pid > 1 && (!d.Equal(sent) || pid != sentPID) {
			if err := m.dog.arm(pid, d.Add(after)); err != nil {
				m.log.Warn("watchdog gone", zap.Error(err))
				return false
			}
			sent, sentPID = d, pid
		}
		return true
	})
	return func() {
		stopArming()
		_ = m.dog.disarm()
	}
}

// recordOptime writes the primary's WAL position flushed (what a standby
// can have been sent, and what survives the primary's crash) to OptimeKey,
// which bounds how far behind a standby may be and still be promoted
// (checkHealthiest). A failure is logged and tried again next time.
func (m *Manager) recordOptime(ctx context.Context, term tenure.Term) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DCS.LoopWait)
	defer cancel()
	err := func() error {
		conn, err := m.pg.Connect(ctx)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var lsn string
		if err := conn.QueryRow(ctx, `SELECT pg_current_wal_flush_lsn()::text`).Scan(&lsn); err != nil {
			return err
		}
		// Only while this term's entry is the one the key had: a Put
		// sent late, once a successor leads, must not land over the
		// successor's position.
		_, err = m.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(term.Entry), "=", int64(term.Token))).
			Then(clientv3.OpPut(m.cfg.OptimeKey(), lsn)).
			Commit()
		return err
	}()
	if err != nil && ctx.Err() == nil {
		m.log.Warn("record optime", zap.Error(err))
	}
}

// drainFor is how long the fence of a term that ended for cause may spend
// on a clean shutdown before it shuts down immediately (see
// Postgres.Fence).
//
// Every session ends when the fence starts, whichever the shutdown, so no
// commit lands after that; the clean part only streams what was committed
// to the standbys. It may run while the key is still this member's: at the
// lease deadline (the server cannot expire the key for another
// DeadlineMargin), at a resignation or a shutdown (the key is released
// after this returns). Three quarters of the elector's StopTimeout keep it
// inside the time tenure gives the elected work to stop, with room left
// for the immediate shutdown. When the key may be another member's already
// (the session expired, the key was deleted), a new primary may be
// promoting from this member's standbys: the fence is immediate, so that no
// WAL of this term reaches them from now on.
func (m *Manager) drainFor(cause error) time.Duration {
	if errors.Is(cause, tenure.ErrSessionExpired) || errors.Is(cause, tenure.ErrOwnershipLost) {
		return 0
	}
	return m.e.Config().StopTimeout * 3 / 4
}

// promote turns the standby into the primary of term: pg_promote, then the
// term into the fence row and the history (one transaction), then
// default_transaction_read_only off.
func (m *Manager) promote(ctx context.Context, term tenure.Term) error {
	select { // wait for a loop pass in progress, or for the term to end
	case m.pgLock <- struct{}{}:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	defer func() { <-m.pgLock }()
	if !m.pg.Running() {
		return errors.New("PostgreSQL is not running")
	}
	// A member that was primary, and has not been rewound since, may hold
	// WAL that the members promoted after it never had: promoted, it would
	// drop their history. It may lead only when no other member was
	// promoted since it was (converge keeps it out of the election
	// otherwise; this is the last check, against /last-primary as it is
	// now).
	m.mu.Lock()
	needRewind := m.needRewind
	m.mu.Unlock()
	if needRewind {
		last, err := m.promotedLast(ctx)
		if err != nil {
			return err
		}
		if !last {
			return errors.New("another member was promoted after this one: its data must be rewound before it may be promoted")
		}
	}
	began := time.Now()
	conn, err := m.pg.Connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var inRecovery bool
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil {
		return err
	}
	if inRecovery {
		if y := m.checkHealthiest(ctx); y != nil {
			return y
		}
		// Recorded before the promotion: a member that finds its own name
		// there on restart knows no other was promoted after it.
		if _, err := m.cli.Put(ctx, m.cfg.LastPrimaryKey(), m.cfg.Name); err != nil {
			return fmt.Errorf("record %s: %w", m.cfg.LastPrimaryKey(), err)
		}
		m.mu.Lock()
		m.promoting = true
		m.mu.Unlock()
		// From here on the data may diverge from the old timeline's: marked
		// before pg_promote, so that a crash cannot lose it.
		if err := m.pg.MarkNeedsRewind(true); err != nil {
			return fmt.Errorf("mark the data as a primary's: %w", err)
		}
		m.event("promoting", zap.Uint64("term", term.Token))
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok); err != nil {
			return fmt.Errorf("pg_promote: %w", err)
		}
		if !ok {
			return errors.New("pg_promote: not promoted within 60s")
		}
	}
	// A checkpoint on the new timeline, so that pg_rewind, which reads the
	// timeline from the control file, sees it at once (as Patroni does).
	if _, err := conn.Exec(ctx, `CHECKPOINT`); err != nil {
		return fmt.Errorf("checkpoint after promotion: %w", err)
	}
	if err := m.pg.SetStandby(false); err != nil { // gone already after promotion; a restart must not demote
		return err
	}
	if err := recordTerm(ctx, conn, term.Token, m.cfg.Name); err != nil {
		return fmt.Errorf("record term %d: %w", term.Token, err)
	}
	if err := m.recordClusterID(ctx); err != nil {
		return err
	}
	if err := m.pg.Configure("", false); err != nil {
		return err
	}
	if err := m.pg.Reload(); err != nil {
		return err
	}
	// Wait until new sessions see the reload.
	for {
		c, err := m.pg.Connect(ctx)
		if err != nil {
			return err
		}
		var ro string
		err = c.QueryRow(ctx, `SHOW default_transaction_read_only`).Scan(&ro)
		c.Close(context.WithoutCancel(ctx))
		if err != nil {
			return err
		}
		if ro == "off" {
			break
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(10 * time.Millisecond):
		}
	}
	m.log.Info("promoted", zap.Uint64("term", term.Token), zap.Duration("took", time.Since(began)))
	return nil
}

// yieldError is promote's refusal to promote this member, before it
// changed anything: another member standing for election has WAL this one
// has not received (to names it), or this one is further behind the
// primary's last recorded position than dcs.maximum_lag_on_failover.
type yieldError struct {
	to     string // the member with more WAL; "" when refused for lag
	own    string // this member's position (ReceivedLSN)
	theirs string // the other member's position, or the recorded optime
	why    string
}

func (e *yieldError) Error() string { return e.why }

// checkHealthiest is a failover's last check before pg_promote (Patroni's
// is_healthiest_node). It refuses with a *yieldError when another member
// that stands in the election's queue now (an entry under LeaderKey, read
// from etcd) and runs as a standby has received WAL this one has not (a
// later timeline, or the same timeline further on), as that member's
// /status says within one second (or loop_wait, if shorter). Promoted,
// this member would lose what only that member has (the old primary's
// last commits), and that member's history would be past the new
// primary's fork point. A member that does not answer is not waited for.
// It refuses too when this member is more than
// dcs.maximum_lag_on_failover bytes behind the position the primary
// recorded last (OptimeKey): with every candidate that far behind, the
// cluster stays without a primary (as Patroni's does) until the old
// primary returns or an operator raises the limit. When the check itself
// fails (a read that timed out), it refuses too: nothing has been changed
// yet, and promoting without knowing could lose commits.
func (m *Manager) checkHealthiest(ctx context.Context) *yieldError {
	bound := min(time.Second, m.cfg.DCS.LoopWait) // for each step below
	cctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	failed := func(err error) *yieldError {
		return &yieldError{why: "cannot tell whether another candidate has more WAL: " + err.Error()}
	}
	self := m.queryStatus(cctx)
	if self.err != nil {
		return failed(self.err)
	}
	own, ok := parseLSN(self.ReceivedLSN)
	if !ok {
		return failed(fmt.Errorf("no WAL position of its own (received_lsn %q)", self.ReceivedLSN))
	}
	queue, err := m.cli.Get(cctx, m.cfg.LeaderKey()+"/", clientv3.WithPrefix())
	if err != nil {
		return failed(fmt.Errorf("read the election's queue: %w", err))
	}
	queued := map[string]bool{}
	for _, kv := range queue.Kvs {
		queued[string(kv.Value)] = true
	}
	// The members' answers get their own second (or loop_wait), not what
	// the reads above left of theirs: one that does not answer in time
	// is not waited for, which is the direction that may lose commits.
	fctx, fcancel := context.WithTimeout(ctx, bound)
	defer fcancel()
	others := make([]Status, len(m.cfg.Members))
	var wg sync.WaitGroup
	for i, mem := range m.cfg.Members {
		if mem.Name == m.cfg.Name || !queued[mem.Name] {
			continue
		}
		wg.Go(func() {
			if st, err := fetchStatus(fctx, mem.API); err == nil && st.Name == mem.Name {
				others[i] = st
			}
		})
	}
	wg.Wait()
	for _, st := range others {
		if !st.Running || !st.InRecovery || st.Name == "" {
			continue
		}
		theirs, ok := parseLSN(st.ReceivedLSN)
		if !ok {
			continue
		}
		if st.Timeline > self.Timeline || (st.Timeline == self.Timeline && theirs > own) {
			return &yieldError{to: st.Name, own: self.ReceivedLSN, theirs: st.ReceivedLSN,
				why: fmt.Sprintf("%s has more WAL (timeline %d, %s) than this member (timeline %d, %s): it should be promoted instead",
					st.Name, st.Timeline, st.ReceivedLSN, self.Timeline, self.ReceivedLSN)}
		}
	}
	octx, ocancel := context.WithTimeout(ctx, bound)
	defer ocancel()
	if optime, why, err := m.tooFarBehind(octx, self); err != nil {
		return failed(err)
	} else if why != "" {
		return &yieldError{own: self.ReceivedLSN, theirs: optime, why: why}
	}
	m.log.Info("most WAL of the candidates", zap.String("lsn", self.ReceivedLSN), zap.Int("timeline", self.Timeline))
	return nil
}

// tooFarBehind reads the primary's last recorded position (OptimeKey)
// and, when self, a standby's status, is more than
// dcs.maximum_lag_on_failover bytes behind it, says so in why. It returns
// the recorded position too ("" when none was recorded).
func (m *Manager) tooFarBehind(ctx context.Context, self Status) (optime, why string, err error) {
	own, ok := parseLSN(self.ReceivedLSN)
	if !ok {
		return "", "", fmt.Errorf("no WAL position to compare (received_lsn %q)", self.ReceivedLSN)
	}
	r, err := m.cli.Get(ctx, m.cfg.OptimeKey())
	if err != nil {
		return "", "", fmt.Errorf("read %s: %w", m.cfg.OptimeKey(), err)
	}
	if len(r.Kvs) != 1 {
		return "", "", nil
	}
	optime = string(r.Kvs[0].Value)
	at, ok := parseLSN(optime)
	if ok && at > own && at-own > uint64(m.cfg.DCS.MaximumLagOnFailover) {
		why = fmt.Sprintf("%d bytes of WAL behind the primary's last recorded position %s (at %s), more than dcs.maximum_lag_on_failover (%d)",
			at-own, optime, self.ReceivedLSN, m.cfg.DCS.MaximumLagOnFailover)
	}
	return optime, why, nil
}

// eligible reports whether this member, a running standby, may stand for
// election: not more than dcs.maximum_lag_on_failover behind the
// primary's last recorded position (Patroni keeps such a member out of
// the leader race too). It logs an "ineligible" event when that changes
// to no, and an "eligible" one when back.
func (m *Manager) eligible(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.DCS.LoopWait)
	defer cancel()
	self := m.queryStatus(ctx)
	if self.err != nil || !self.InRecovery {
		return self.err == nil
	}
	_, why, err := m.tooFarBehind(ctx, self)
	if err != nil {
		m.log.Warn("eligibility", zap.Error(err))
		return false
	}
	m.mu.Lock()
	was := m.ineligible
	m.ineligible = why
	m.mu.Unlock()
	switch {
	case why != "" && was == "":
		m.event("ineligible", zap.String("reason", why))
	case why == "" && was != "":
		m.event("eligible")
	}
	return why == ""
}

// demoted is OnDemoted: the elected work has fenced PostgreSQL already.
// Withdraw from the election until the loop has rejoined this member as a
// standby of the new primary.
func (m *Manager) demoted(term tenure.Term, reason error) {
	m.event("demoted", zap.Uint64("term", term.Token), zap.NamedError("reason", reason))
	m.mu.Lock()
	cancel := m.runCancel
	m.mu.Unlock()
	if cancel != nil {
		cancel() // Run returns after this callback; the loop starts it again
	}
	m.wake()
}

// hardStop is OnHardStop: the elected work did not return in time, so kill
// PostgreSQL outright.
func (m *Manager) hardStop(term tenure.Term) {
	m.log.Error("elected work did not stop in time; killing PostgreSQL", zap.Uint64("term", term.Token))
	m.pg.mu.Lock()
	if m.pg.cmd != nil {
		_ = syscall.Kill(-m.pg.cmd.Process.Pid, syscall.SIGKILL)
	}
	m.pg.mu.Unlock()
}
