package etcdelect_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/etcdelect"
)

// TestMetricsAndEndpoints_ElectResignReelect drives a real election on
// embedded etcd through elect → resign → re-elect and checks every metric
// and HTTP endpoint on the leader and the follower after each step.
func TestMetricsAndEndpoints_ElectResignReelect(t *testing.T) {
	key := electiontest.Key(t)
	ctx := ctxT(t, 30*time.Second)
	type node struct {
		e   *election.Elector
		reg *prometheus.Registry
		srv *httptest.Server
		log *observer.ObservedLogs
	}
	newNode := func(id string) node {
		reg := prometheus.NewRegistry()
		m, err := election.NewMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zap.DebugLevel)
		cli := newClient(t, endpoint)
		t.Cleanup(func() { cli.Close() })
		e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: id, TTL: 2 * time.Second},
			election.WithMetrics(m), election.WithLogger(zap.New(core)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		srv := httptest.NewServer(e.Handler(reg))
		t.Cleanup(srv.Close)
		return node{e, reg, srv, logs}
	}
	a, b := newNode("a"), newNode("b")
	gauge := func(n node, name string) float64 {
		t.Helper()
		mfs, err := n.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		t.Fatalf("no gauge %s", name)
		return 0
	}
	transitions := func(n node, reason string) float64 {
		t.Helper()
		c, err := testutil.GatherAndCount(n.reg, "tenure_transitions_total")
		if err != nil || c == 0 {
			t.Fatalf("tenure_transitions_total: %d series, %v", c, err)
		}
		mfs, _ := n.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "tenure_transitions_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" && l.GetValue() == reason {
						return m.GetCounter().GetValue()
					}
				}
			}
		}
		t.Fatalf("no transitions series for reason %s", reason)
		return 0
	}
	code := func(n node, path string) int {
		t.Helper()
		resp, err := http.Get(n.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	status := func(n node) election.Status {
		t.Helper()
		resp, err := http.Get(n.srv.URL + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st election.Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	check := func(step string, n node, leader bool, term uint64, elected, resigned float64) {
		t.Helper()
		want := map[bool]float64{true: 1, false: 0}[leader]
		if got := gauge(n, "tenure_is_leader"); got != want {
			t.Errorf("%s: tenure_is_leader = %v, want %v", step, got, want)
		}
		if got := gauge(n, "tenure_term"); got != float64(term) {
			t.Errorf("%s: tenure_term = %v, want %v", step, got, term)
		}
		if got := transitions(n, "elected"); got != elected {
			t.Errorf("%s: transitions{elected} = %v, want %v", step, got, elected)
		}
		if got := transitions(n, "resigned"); got != resigned {
			t.Errorf("%s: transitions{resigned} = %v, want %v", step, got, resigned)
		}
		if got := gauge(n, "tenure_suspended"); got != 0 {
			t.Errorf("%s: tenure_suspended = %v", step, got)
		}
		wantCode := map[bool]int{true: 200, false: 503}[leader]
		if c := code(n, "/leader"); c != wantCode {
			t.Errorf("%s: /leader = %d, want %d", step, c, wantCode)
		}
		if c := code(n, "/healthz"); c != 200 {
			t.Errorf("%s: /healthz = %d, want 200", step, c)
		}
		if c := code(n, "/metrics"); c != 200 {
			t.Errorf("%s: /metrics = %d", step, c)
		}
	}

	// Step 1: a is elected; b waits.
	ta, err := a.e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bTerm := make(chan uint64, 1)
	go func() {
		tb, err := b.e.Campaign(ctx)
		if err != nil {
			t.Errorf("b: %v", err)
		}
		bTerm <- tb.Token
	}()
	waitPos(t, b.e, 1)
	check("a elected", a, true, ta.Token, 1, 0)
	check("b waiting", b, false, 0, 0, 0)
	if rem := gauge(a, "tenure_lease_remaining_seconds"); rem <= 0 || rem > 2 {
		t.Errorf("tenure_lease_remaining_seconds = %v, want in (0, 2]", rem)
	}
	if st := status(b); st.State != "campaigning" || st.Position != 1 || st.Leader == nil || st.Leader.Identity != "a" || st.Leader.Term != ta.Token {
		t.Errorf("b's /status = %+v", st)
	}
	if st := status(a); st.State != "leader" || st.Term != ta.Token {
		t.Errorf("a's /status = %+v", st)
	}

	// Step 2: a resigns; b is elected.
	if err := a.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	tb := <-bTerm
	check("a resigned", a, false, 0, 1, 1)
	check("b elected", b, true, tb, 1, 0)

	// Step 3: a campaigns again behind b; b resigns; a is re-elected.
	aTerm := make(chan uint64, 1)
	go func() {
		t2, err := a.e.Campaign(ctx)
		if err != nil {
			t.Errorf("a: %v", err)
		}
		aTerm <- t2.Token
	}()
	waitPos(t, a.e, 1)
	if err := b.e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ta2 := <-aTerm
	check("a re-elected", a, true, ta2, 2, 1)
	check("b resigned", b, false, 0, 1, 1)
	if ta2 <= tb || tb <= ta.Token {
		t.Errorf("terms %d, %d, %d do not grow", ta.Token, tb, ta2)
	}
	if n, err := testutil.GatherAndCount(a.reg, "tenure_campaign_seconds"); err != nil || n != 1 {
		t.Errorf("tenure_campaign_seconds series = %d, %v", n, err)
	}

	// Names and help texts follow Prometheus conventions.
	problems, err := promlint.NewWithMetricFamilies(mustGather(t, a.reg)).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}

	// The logger saw the transitions, with key and identity on every line
	// and the term where known.
	for _, msg := range []string{"elected", "resigned"} {
		lines := a.log.FilterMessage(msg).All()
		if len(lines) == 0 {
			t.Errorf("no %q log line", msg)
			continue
		}
		for _, l := range lines {
			f := l.ContextMap()
			if f["key"] != key || f["identity"] != "a" || f["token"] == nil {
				t.Errorf("%q line lacks key/identity/token: %v", msg, f)
			}
			if l.Level != zap.InfoLevel {
				t.Errorf("%q logged at %v, want info", msg, l.Level)
			}
		}
	}
}

func mustGather(t *testing.T, g prometheus.Gatherer) []*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// TestMetrics_LeaseLossIsCountedAndLoggedAtWarn: a leader cut off from etcd
// counts a lease_expired transition and a lost session, and logs the loss
// at Warn with its reason.
func TestMetrics_LeaseLossIsCountedAndLoggedAtWarn(t *testing.T) {
	h := newHarness(t)
	key := electiontest.Key(t)
	reg := prometheus.NewRegistry()
	m, err := election.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	b := h.NewBackend(t)
	e, err := election.New(b, election.Config{Key: key, Identity: "a", TTL: 2 * time.Second}, election.WithMetrics(m), election.WithLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if _, err := e.Campaign(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	heal := h.CutOff(t, b)
	defer heal()
	waitFor(t, "suspension", func() bool {
		return strings.Contains(gatherText(t, reg), `tenure_suspended{backend="etcd",key="`+key+`"} 1`)
	})
	<-e.Done()
	// The term's loss is counted and logged just after its context ends,
	// by the goroutine that ended it (a fresh-clone CI run read the
	// metrics in between, 2026-11-30).
	wants := []string{
		`tenure_transitions_total{backend="etcd",key="` + key + `",reason="lease_expired"} 1`,
		`tenure_session_expirations_total{backend="etcd",key="` + key + `"} 1`,
		`tenure_is_leader{backend="etcd",key="` + key + `"} 0`,
	}
	var out string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		out = gatherText(t, reg)
		all := logs.FilterMessage("leadership lost").Len() > 0
		for _, want := range wants {
			all = all && strings.Contains(out, want)
		}
		if all {
			break
		}
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Every failed keep-alive counts as a watchdog failure; the cut lasts
	// at least until the deadline, so there was at least one.
	failures := regexp.MustCompile(`tenure_watchdog_failures_total\{backend="etcd",key="` + regexp.QuoteMeta(key) + `"\} (\d+)`).FindStringSubmatch(out)
	if failures == nil || failures[1] == "0" {
		t.Errorf("tenure_watchdog_failures_total after a cut-off = %v, want at least 1", failures)
	}
	lost := logs.FilterMessage("leadership lost").All()
	if len(lost) != 1 || lost[0].Level != zap.WarnLevel || !strings.Contains(lost[0].ContextMap()["reason"].(string), "lease deadline") {
		t.Errorf("leadership loss log lines = %v", lost)
	}
}

func gatherText(t *testing.T, g prometheus.Gatherer) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(g, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestMetrics_LockWaitAndFailover: a Mutex records how long Lock waited, and
// an observer records how long the key stayed vacant between two leaders.
func TestMetrics_LockWaitAndFailover(t *testing.T) {
	key := electiontest.Key(t)
	ctx := ctxT(t, 30*time.Second)
	reg := prometheus.NewRegistry()
	m, err := election.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	newBackend := func() *etcdelect.Backend {
		cli := newClient(t, endpoint)
		t.Cleanup(func() { cli.Close() })
		return etcdelect.New(cli)
	}
	cfg := func(id string) election.Config { return election.Config{Key: key, Identity: id, TTL: 2 * time.Second} }

	// The observer reports on a registry of its own: one Metrics takes one
	// Elector per key and backend.
	obsReg := prometheus.NewRegistry()
	om, err := election.NewMetrics(obsReg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := election.New(newBackend(), cfg("observer"), election.WithMetrics(om))
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close(context.Background())
	octx, stop := context.WithCancel(ctx)
	leaders := obs.Observe(octx)

	holder, err := election.NewMutex(newBackend(), cfg("holder"))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	waiter, err := election.NewMutex(newBackend(), cfg("waiter"), election.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(context.Background())

	if _, err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	locked := make(chan struct{})
	go func() {
		if _, err := waiter.Lock(ctx); err != nil {
			t.Errorf("waiter: %v", err)
		}
		close(locked)
	}()
	waitPos(t, waiter.Elector(), 1)
	const held = 300 * time.Millisecond
	time.Sleep(held)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-locked
	if n, sum := histogram(t, reg, "tenure_lock_wait_seconds"); n != 1 || sum < held.Seconds() {
		t.Errorf("tenure_lock_wait_seconds: count %d sum %.3f, want 1 observation ≥ %.1f s", n, sum, held.Seconds())
	}

	// The waiter unlocks: the key is vacant until the holder locks again.
	if err := waiter.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	const vacant = 300 * time.Millisecond
	time.Sleep(vacant)
	if _, err := holder.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the observer to see the new leader", func() bool {
		n, _ := histogram(t, obsReg, "tenure_failover_seconds")
		return n >= 1
	})
	// The observer learns of the vacancy from the delete's watch event,
	// which may reach it a little after Unlock has returned (once, under
	// -race on a loaded machine, 1 ms later than the new leader's event
	// lagged its Lock): allow it 50 ms.
	if n, sum := histogram(t, obsReg, "tenure_failover_seconds"); n != 1 || sum < (vacant-50*time.Millisecond).Seconds() {
		t.Errorf("tenure_failover_seconds: count %d sum %.3f, want 1 observation ≥ %.2f s (the %v vacancy less the observer's lag)", n, sum, (vacant - 50*time.Millisecond).Seconds(), vacant)
	}
	stop()
	for range leaders {
	}
}

// histogram returns the sample count and sum of the histogram name in g.
func histogram(t *testing.T, g prometheus.Gatherer, name string) (uint64, float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				if h := m.GetHistogram(); h != nil {
					return h.GetSampleCount(), h.GetSampleSum()
				}
			}
		}
	}
	return 0, 0
}
