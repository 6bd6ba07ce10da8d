// Package chaos is tenure's fault-injection safety suite. The test process
// is the checker: it runs real servers (a three-member etcd cluster
// embedded in it, a three-server ZooKeeper ensemble as java child
// processes), a fenced register that the leaders write to, and candidates
// as separate OS processes (this test binary re-executed), each behind its
// own fault proxies, so that SIGKILL, SIGSTOP, blackholes and latency are
// real. After every fault it checks that a new leader comes within the
// documented bound, and after every run that no stale write was accepted,
// that no two leaders overlapped (but a frozen one), that no entry was left
// behind, and that the register's history is linearizable (porcupine).
// On Redis (efficiency only) overlaps and stale writes are reported, not
// failed; a lane left without a leader past the bound, or a candidate
// that dies of a panic, fails on every backend.
//
// go test runs one short run of every scenario on every backend and shows
// the checker catching two broken variants. `make chaos` runs the long
// mode: CHAOS_DURATION (default 3m) of runs per backend, several elections
// in parallel, and prints the table.
package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/zkserver"
)

const (
	// ttl is every candidate's session TTL.
	ttl = 2 * time.Second
	// writeEvery is the pause between a leader's writes.
	writeEvery = 50 * time.Millisecond
)

// env holds the servers every test of the package shares.
var env struct {
	dir     string
	servers map[string]servers
}

func TestMain(m *testing.M) {
	if os.Getenv(envCandidate) == "1" {
		os.Exit(candidateMain())
	}
	code := func() int {
		if err := zkserver.Installed(); err != nil {
			fmt.Fprintln(os.Stderr, "the chaos suite needs ZooKeeper:", err)
			return 1
		}
		dir, err := os.MkdirTemp("", "tenure-chaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		env.dir, env.servers = dir, map[string]servers{}
		for _, be := range backends {
			s, err := be.start(filepath.Join(dir, be.name))
			if err != nil {
				fmt.Fprintf(os.Stderr, "start %s: %v\n", be.name, err)
				return 1
			}
			defer s.Close()
			env.servers[be.name] = s
		}
		return m.Run()
	}()
	if code == 0 {
		// A peer request that reaches an etcd member while it is being
		// stopped abruptly (Cluster.Stop, RestartAll) blocks for good on
		// the closed backend's read lock inside etcd's own HTTP handler:
		// etcd's goroutine, not one of tenure's or the harness's.
		if err := goleak.Find(goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/storage/backend.(*baseReadTx).UnsafeRange")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	// The table comes last, ending with "violations: N".
	if v := printReport(os.Stdout); v > 0 && code == 0 {
		code = 1
	}
	os.Exit(code)
}

// The long mode: CHAOS_DURATION set (make chaos).
func longMode() (time.Duration, bool) {
	v := os.Getenv("CHAOS_DURATION")
	if v == "" {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		panic("CHAOS_DURATION: " + err.Error())
	}
	return d, true
}

// selected reports whether name is in the comma-separated list in the
// environment variable k, or k is unset.
func selected(k, name string) bool {
	v := os.Getenv(k)
	return v == "" || slices.Contains(strings.Split(v, ","), name)
}

func envInt(k string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n > 0 {
		return n
	}
	return def
}

var runSeq struct {
	sync.Mutex
	n int
}

func nextRunID(be, sc string) string {
	runSeq.Lock()
	defer runSeq.Unlock()
	runSeq.n++
	return fmt.Sprintf("%s-%s-%d-%d", be, sc, os.Getpid(), runSeq.n)
}

// TestChaos runs every scenario on every backend. Short mode (go test): one
// run of one fault each, one election at a time. Long mode (CHAOS_DURATION
// set): runs of CHAOS_ROUNDS (5) faults on CHAOS_LANES (4) parallel
// elections, scenario after scenario, until the duration has passed.
// CHAOS_BACKENDS and CHAOS_SCENARIOS (comma-separated names) narrow it.
func TestChaos(t *testing.T) {
	dur, long := longMode()
	lanes, rounds := 1, 1
	if long {
		lanes, rounds = envInt("CHAOS_LANES", 4), envInt("CHAOS_ROUNDS", 5)
	}
	for _, be := range backends {
		if !selected("CHAOS_BACKENDS", be.name) {
			continue
		}
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			reg, err := newRegister(false)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			deadline := time.Now().Add(dur)
			for pass := 0; pass == 0 || long && time.Now().Before(deadline); pass++ {
				for _, sc := range scenarios {
					if long && time.Now().After(deadline) {
						break
					}
					if !selected("CHAOS_SCENARIOS", sc.name) || slices.Contains(be.unsupported, sc.name) {
						continue
					}
					res := doRun(runConfig{
						be: be, srv: env.servers[be.name], reg: reg, sc: sc, id: nextRunID(be.name, sc.name),
						lanes: lanes, rounds: rounds, ttl: ttl, every: writeEvery, logf: t.Logf,
					})
					record(res)
					n, ds := res.failovers()
					t.Logf("%s/%s: %d faults, %d failovers %v, %d kept, %d stale writes refused, %d excused overlaps (%d of their writes accepted after the successor began), %d violations",
						be.name, sc.name, len(res.faults), n, roundAll(ds), len(res.faults)-n, res.refused, res.excused, res.lateOK, len(res.violations))
					for _, h := range res.harness {
						t.Errorf("%s/%s: harness: %s", be.name, sc.name, h)
					}
					for _, v := range res.violations {
						if be.linearizable || !v.exempt() {
							t.Errorf("%s/%s: %v", be.name, sc.name, v)
						} else {
							t.Logf("%s/%s (efficiency only): %v", be.name, sc.name, v)
						}
					}
					if len(res.faults) == 0 {
						t.Errorf("%s/%s: no fault was injected", be.name, sc.name)
					}
					if !sc.mayKeep && n < len(res.faults) {
						t.Errorf("%s/%s: %d faults but %d failovers: every %s must end the term", be.name, sc.name, len(res.faults), n, sc.name)
					}
					// A partition misses when every lane's leader is on the
					// ensemble's leader server, which is never cut off
					// (go-zookeeper picks a server at random): about 1 in
					// 3^lanes. Over 3 or more, one at least must hit.
					if sc.name == "partition" {
						t.Logf("%s/partition: %d of %d partitions cut off a server a leader's session was on", be.name, res.partitionHits, res.partitions)
					}
					if sc.name == "partition" && be.linearizable && res.partitions >= 3 && res.partitionHits == 0 {
						t.Errorf("%s/partition: no partition of %d cut off a server a leader's session was on: the scenario did not exercise renewals from a cut-off server", be.name, res.partitions)
					}
					if sc.name == "stop" && res.refused == 0 && be.linearizable {
						t.Errorf("%s/stop: the frozen holders' writes after waking were never refused: the scenario did not exercise the fence", be.name)
					}
				}
			}
		})
	}
}

// TestChecker_CatchesUnfencedRegister: with the register's fence off, a
// holder frozen past its TTL writes with its stale term after waking and
// the register accepts it: the checker must report invariant 1 (tokens
// went down) and invariant 5 (the history is not that of a fenced
// register).
func TestChecker_CatchesUnfencedRegister(t *testing.T) {
	for _, be := range backends {
		if !be.linearizable {
			continue // a broken variant of a lock that guarantees nothing proves nothing
		}
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			res := brokenRun(t, be, true, "stop", 2, "", "unfenced")
			got := invariants(res.violations)
			t.Logf("broken variant (fence off), %s: %v", be.name, res.violations)
			if !got[1] || !got[5] {
				t.Fatalf("the checker missed the unfenced register: invariants violated %v, want 1 and 5", got)
			}
		})
	}
}

// TestChecker_CatchesDisabledLeaseDeadline: a cut-off leader whose work
// ignores the lease deadline (it runs on for 2·TTL after its context ends,
// and OnHardStop does not stop it) works on after the server has elected a
// successor: the checker must report invariant 2 (overlapping leaders that
// were not frozen). The fence still refuses its late writes (invariant 1
// holds).
func TestChecker_CatchesDisabledLeaseDeadline(t *testing.T) {
	for _, be := range backends {
		if !be.linearizable {
			continue // a broken variant of a lock that guarantees nothing proves nothing
		}
		if !selected("CHAOS_BACKENDS", be.name) {
			continue
		}
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			res := brokenRun(t, be, false, "blackhole", 1, brokenNoDeadline, "nodeadline")
			got := invariants(res.violations)
			t.Logf("broken variant (lease deadline off), %s: %d faults %v: %v", be.name, len(res.faults), res.faults, res.violations)
			if !got[2] {
				t.Fatalf("the checker missed leaders overlapping without a lease deadline: invariants violated %v, want 2", got)
			}
			if got[1] {
				t.Fatalf("the fence accepted a stale write: %v", res.violations)
			}
		})
	}
}

// TestChecker_CatchesALeaderlessLane: processes that report their first
// term ended at once but keep their entry at the head of the queue for
// 6 s (the class of an orphaned ZooKeeper node, or a spurious loss) leave
// their lane leaderless, three times, with no fault to explain it: the
// checker must report invariant 3. Before checkGaps it passed (the wait
// for a writing leader allows 30 s).
func TestChecker_CatchesALeaderlessLane(t *testing.T) {
	for _, be := range backends {
		if !be.linearizable {
			continue // the next candidate takes a Redis key without waiting for the entry
		}
		if !selected("CHAOS_BACKENDS", be.name) {
			continue
		}
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			res := brokenRun(t, be, false, "kill", 0, brokenStall, "stall")
			got := invariants(res.violations)
			t.Logf("broken variant (a stalled entry), %s: %v", be.name, res.violations)
			if !got[livenessInvariant] {
				t.Fatalf("the checker missed a lane with no leader for %v and no fault: invariants violated %v, want %d", stallFor, got, livenessInvariant)
			}
		})
	}
}

// brokenRun runs one lane on be for a checker test: scenario sc for
// rounds rounds, the register's fence off when unfenced, the candidates
// in variant broken ("" for none), under a run id tagged tag. Harness
// failures fail t.
func brokenRun(t *testing.T, be backend, unfenced bool, sc string, rounds int, broken, tag string) result {
	t.Helper()
	reg, err := newRegister(unfenced)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	res := doRun(runConfig{be: be, srv: env.servers[be.name], reg: reg, sc: scenarioNamed(sc), id: nextRunID(be.name, tag),
		lanes: 1, rounds: rounds, ttl: ttl, every: writeEvery, broken: broken, logf: t.Logf})
	for _, h := range res.harness {
		t.Errorf("harness: %s", h)
	}
	return res
}

func invariants(vs []violation) map[int]bool {
	m := map[int]bool{}
	for _, v := range vs {
		m[v.inv] = true
	}
	return m
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// ---- the report ----

var report struct {
	sync.Mutex
	results []result
}

func record(r result) {
	report.Lock()
	defer report.Unlock()
	report.results = append(report.results, r)
}

// printReport prints the table of TestChaos's runs and the violations
// line, and returns the number of violations (harness failures count as
// violations: a run that could not check proves nothing).
func printReport(w *os.File) int {
	report.Lock()
	defer report.Unlock()
	if len(report.results) == 0 {
		return 0
	}
	type row struct {
		runs, faults, kept, refused, excused, lateOK, violations, unsafe, srvLeader int
		ds                                                                          []time.Duration
		maxBound                                                                    time.Duration
	}
	rows := map[[2]string]*row{}
	var keys [][2]string
	total := 0
	for _, res := range report.results {
		k := [2]string{res.scenario, res.backend}
		r := rows[k]
		if r == nil {
			r = &row{}
			rows[k] = r
			keys = append(keys, k)
		}
		r.runs++
		r.faults += len(res.faults)
		n, ds := res.failovers()
		r.kept += len(res.faults) - n
		r.ds = append(r.ds, ds...)
		for _, f := range res.faults {
			r.maxBound = max(r.maxBound, f.bound)
			if f.serverLeader {
				r.srvLeader++
			}
		}
		r.refused += res.refused
		r.excused += res.excused
		r.lateOK += res.lateOK
		bad := len(res.violations)
		if res.efficiencyOnly {
			// Overlaps and stale tokens are what "efficiency only"
			// means; a lane left without a leader, a candidate that does
			// not exit or entries left behind are not.
			bad = 0
			for _, v := range res.violations {
				if v.exempt() {
					r.unsafe++
				} else {
					bad++
				}
			}
		}
		bad += len(res.harness)
		r.violations += bad
		total += bad
	}
	order := func(k [2]string) int {
		return slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == k[0] })*10 +
			slices.IndexFunc(backends, func(b backend) bool { return b.name == k[1] })
	}
	sort.Slice(keys, func(i, j int) bool { return order(keys[i]) < order(keys[j]) })
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-11s %-10s %5s %6s %9s %5s %8s %8s %8s %8s %7s %7s %7s %10s\n",
		"scenario", "backend", "runs", "faults", "failovers", "kept", "median", "max", "bound", "refused", "excused", "late-ok", "srv-ldr", "violations")
	transitions := 0
	for _, k := range keys {
		r := rows[k]
		sort.Slice(r.ds, func(i, j int) bool { return r.ds[i] < r.ds[j] })
		med, mx := "-", "-"
		if len(r.ds) > 0 {
			med = fmtSec(r.ds[len(r.ds)/2])
			mx = fmtSec(r.ds[len(r.ds)-1])
		}
		v := strconv.Itoa(r.violations)
		if r.unsafe > 0 {
			v += fmt.Sprintf(" (+%d efficiency-only)", r.unsafe)
		}
		transitions += len(r.ds)
		fmt.Fprintf(&b, "%-11s %-10s %5d %6d %9d %5d %8s %8s %8s %8d %7d %7d %7d %10s\n",
			k[0], k[1], r.runs, r.faults, len(r.ds), r.kept, med, mx, fmtSec(r.maxBound), r.refused, r.excused, r.lateOK, r.srvLeader, v)
	}
	fmt.Fprintf(&b, "failovers (fault-injected transitions): %d\n", transitions)
	fmt.Fprintf(&b, "violations: %d\n", total)
	fmt.Fprint(w, b.String())
	return total
}

func fmtSec(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }
