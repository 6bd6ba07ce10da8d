package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/internal/redisserver"
)

// jobEnv makes the test binary run as the cron-report program, so that the
// replicas' tenure exec runs the job without a separate build.
const jobEnv = "CRON_REPORT_TEST_JOB"

func TestMain(m *testing.M) {
	if os.Getenv(jobEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

// syncBuffer collects the simulation's log for a failure message.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCronReport runs the demo's simulation against a real redis-server
// with real tenure processes: per hour, one replica builds the report and
// the others skip; the long run keeps its lock past its TTL; the report
// exists once per hour; the metrics files count what each replica did.
func TestCronReport(t *testing.T) {
	if err := redisserver.Installed(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := redisserver.Start(filepath.Join(dir, "redis"), redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close) // before TempDir's removal
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := buildTenure(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	sim := simulation{
		Tenure: bin, Job: []string{self}, Env: []string{jobEnv + "=1"},
		Redis: srv.Addr(), Dir: filepath.Join(dir, "work"), Log: &log,
	}
	began := time.Now()
	res, err := sim.run(ctx)
	if res != nil {
		printSummary(&log, &sim, res)
	}
	t.Logf("simulation took %v:\n%s", time.Since(began).Round(time.Millisecond), log.String())
	if err != nil {
		t.Fatal(err)
	}

	runsOf := map[string][]runLine{}
	for _, r := range res.Runs {
		runsOf[r.Date] = append(runsOf[r.Date], r)
	}
	sawLong := false
	for _, h := range res.Hours {
		date := h.Plan.Date
		if len(h.Plan.Late) > 0 {
			sawLong = true
		}
		// Exactly one run of the job per hour, by the one replica whose
		// tenure exec did not skip.
		runs := runsOf[date]
		if len(runs) != 1 {
			t.Errorf("%s: the run log has %d runs, want exactly 1: %+v", date, len(runs), runs)
			continue
		}
		var builder *attempt
		var skipped, first int
		for _, a := range h.Attempts {
			if a.Code != 0 {
				t.Errorf("%s: %s (wave %d) exited %d, want 0; stderr: %s", date, a.Identity, a.Wave, a.Code, a.Stderr)
			}
			if a.MetricsErr != nil {
				t.Errorf("%s: %s (wave %d): %v", date, a.Identity, a.Wave, a.MetricsErr)
			}
			if a.Wave == 0 {
				first++
			}
			if !a.Skipped {
				if builder != nil {
					t.Errorf("%s: both %s and %s ran the job", date, builder.Identity, a.Identity)
				}
				builder = a
				continue
			}
			if a.Wave == 0 {
				skipped++
			}
			// A skip is immediate: tenure exec --no-wait finds the key held.
			if a.Took() > time.Second {
				t.Errorf("%s: %s (wave %d) skipped after %v, want within 1s", date, a.Identity, a.Wave, a.Took())
			}
			if a.Metrics.Skipped != 1 || a.Metrics.Acquired != 0 {
				t.Errorf("%s: %s (wave %d) skipped, but its metrics file says %v; want skipped=1 acquired=0", date, a.Identity, a.Wave, a.Metrics)
			}
		}
		if first != replicas || skipped != replicas-1 || builder == nil {
			t.Errorf("%s: %d replicas started at the top of the hour, %d skipped, builder %v; want %d, %d and one builder", date, first, skipped, builder != nil, replicas, replicas-1)
			continue
		}
		if runs[0].Identity != builder.Identity {
			t.Errorf("%s: the run log names %s, but %s's tenure exec ran the job", date, runs[0].Identity, builder.Identity)
		}
		if builder.Metrics.Acquired != 1 || builder.Metrics.Skipped != 0 || builder.Metrics.Expired != 0 || builder.Metrics.WatchdogFailures != 0 {
			t.Errorf("%s: %s built the report, but its metrics file says %v; want acquired=1 skipped=0 expired=0 watchdog_failures=0", date, builder.Identity, builder.Metrics)
		}
		if builder.Took() < h.Plan.Duration || !strings.Contains(builder.Stdout, "report "+date+": built by "+builder.Identity) {
			t.Errorf("%s: %s's run took %v (the job takes %v); its output: %q", date, builder.Identity, builder.Took(), h.Plan.Duration, builder.Stdout)
		}
		if got, want := res.Reports[reportKey(date)], buildReport(date); got != want {
			t.Errorf("%s: Redis %s = %q, want %q", date, reportKey(date), got, want)
		}

		if len(h.Plan.Late) == 0 {
			continue
		}
		// The long hour: the job runs 2.5 TTLs; replicas that try after the
		// key's first TTL has passed (counted from the job's start, which
		// is after the acquisition) still find it held, because the
		// watchdog extended it.
		if builder.Took() <= 2*demoTTL { // held past two TTLs: the watchdog extended it
			t.Errorf("%s: the long run took %v, want > 2 TTLs (%v)", date, builder.Took(), 2*demoTTL)
		}
		afterTTL := 0
		for _, a := range h.Attempts {
			if a.Wave == 0 {
				continue
			}
			if !a.Start.Before(builder.End) {
				t.Fatalf("%s: %s's late try started %v after the long run ended: the machine is too slow for this test to show anything", date, a.Identity, a.Start.Sub(builder.End))
			}
			if a.Start.After(runs[0].Start.Add(demoTTL)) {
				afterTTL++
			}
		}
		if afterTTL < replicas-1 {
			t.Errorf("%s: %d late tries started after the TTL had passed once, want at least %d", date, afterTTL, replicas-1)
		}
	}
	if !sawLong {
		t.Error("the plan has no long hour")
	}
	if len(res.Reports) != len(res.Hours) {
		t.Errorf("Redis has %d report keys, want one per hour (%d): %q", len(res.Reports), len(res.Hours), res.Reports)
	}
	if len(res.LockKeys) != 0 {
		t.Errorf("lock keys left after every job exited: %q", res.LockKeys)
	}
	// The job run again without the lock overwrites the hour's report.
	if res.DupRunsOfTheHour != 2 || res.ReportsAfterDup != len(res.Hours) || res.DupAfter != res.DupBefore {
		t.Errorf("duplicate run: %d runs of the hour, %d report keys after it (want 2 and %d); value before %q, after %q",
			res.DupRunsOfTheHour, res.ReportsAfterDup, len(res.Hours), res.DupBefore, res.DupAfter)
	}
}

// TestReportOverwrites: the job writes one file per hour through a rename,
// and a second run of the hour replaces it with the same bytes.
func TestReportOverwrites(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	for range 2 {
		if code := run([]string{"report", "--date", "2025-06-01T09", "--dir", dir, "--duration", "0s", "--run-log", filepath.Join(dir, "runs.log")}, &out, &errb); code != 0 {
			t.Fatalf("report exited %d: %s", code, errb.String())
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "2025-06-01T09.txt runs.log" {
		t.Fatalf("the directory holds %q, want the report and the run log only", names)
	}
	b, err := os.ReadFile(filepath.Join(dir, "2025-06-01T09.txt"))
	if err != nil || string(b) != buildReport("2025-06-01T09") {
		t.Fatalf("report file %q (%v), want %q", b, err, buildReport("2025-06-01T09"))
	}
	runs, err := readRunLog(filepath.Join(dir, "runs.log"))
	if err != nil || len(runs) != 2 {
		t.Fatalf("run log: %+v (%v), want 2 runs", runs, err)
	}
	for _, bad := range [][]string{
		{"report", "--date", "2025-06-01", "--dir", dir},
		{"report", "--date", "2025-06-01T09"},
	} {
		if code := run(bad, &out, &errb); code != 2 {
			t.Errorf("%q exited %d, want 2", bad, code)
		}
	}
}

// TestReport_UnreachableRedisSaysItOnce: a report that cannot reach Redis
// exits 1 with one line on stderr, its own. go-redis printed a line of
// its own for each of its four dials before. A process of its own, because
// go-redis writes to the process's stderr, not to run's.
func TestReport_UnreachableRedisSaysItOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused
	cmd := exec.Command(os.Args[0], "report", "--date", "2025-06-01T09", "--duration", "0s", "--redis", addr)
	cmd.Env = append(os.Environ(), jobEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("report with Redis at %s: %v, want exit status 1; stderr: %s", addr, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "report 2025-06-01T09: SET report:2025-06-01T09 on "+addr) {
		t.Errorf("stderr: %q, want the report's one line about the failed SET", stderr.String())
	}
}

// TestCheckDemo: the demo fails (exit 1) unless what it summarises is what
// it claims; before, a demo whose every replica failed still exited 0.
func TestCheckDemo(t *testing.T) {
	good := func() *simResult {
		return &simResult{
			Hours: []*hourResult{{Plan: hourPlan{Date: "2026-01-01T10"}, Attempts: []*attempt{
				{Identity: "replica-1", Code: 0}, {Identity: "replica-2", Skipped: true},
			}}},
			Runs:    []runLine{{Date: "2026-01-01T10", Term: "1", Identity: "replica-1"}},
			Reports: map[string]string{reportKey("2026-01-01T10"): "r"},
			DupKey:  reportKey("2026-01-01T10"), DupBefore: "r", DupAfter: "r",
		}
	}
	if err := checkDemo(good()); err != nil {
		t.Fatalf("checkDemo(a good run) = %v", err)
	}
	for name, spoil := range map[string]func(*simResult){
		"ran twice":      func(r *simResult) { r.Runs = append(r.Runs, r.Runs[0]) },
		"never ran":      func(r *simResult) { r.Runs = nil },
		"a replica fail": func(r *simResult) { r.Hours[0].Attempts[0].Code = -1 },
		"no report":      func(r *simResult) { r.Reports = map[string]string{} },
		"lock key left":  func(r *simResult) { r.LockKeys = []string{"report:x:lock"} },
		"dup changed":    func(r *simResult) { r.DupAfter = "other" },
	} {
		r := good()
		spoil(r)
		if err := checkDemo(r); err == nil {
			t.Errorf("%s: checkDemo = nil, want an error", name)
		}
	}
}

// TestReport_SIGTERMDuringTheWriteDoesNotStopIt: a SIGTERM that comes
// while the report is being written to Redis (here: the link is slow, 0.5 s
// a round trip) does not stop the write, as the README says: the report
// is stored and the job exits 0. Before, the write ran on the context the
// signal cancels, and the job exited 1 without a report.
func TestReport_SIGTERMDuringTheWriteDoesNotStopIt(t *testing.T) {
	if err := redisserver.Installed(); err != nil {
		t.Fatal(err)
	}
	srv, err := redisserver.Start(filepath.Join(t.TempDir(), "redis"), redisserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	proxy, err := faultproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	proxy.Delay(250 * time.Millisecond)
	direct := newRedisClient(srv.Addr())
	defer direct.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const date = "2025-06-01T10"
	cmd := exec.Command(os.Args[0], "report", "--date", date, "--duration", "0s", "--redis", proxy.Addr())
	cmd.Env = append(os.Environ(), jobEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The job's connection has reached the server: its write has begun.
	for {
		list, err := direct.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(strings.TrimSpace(list), "\n")+1 >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the job never connected to Redis")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("SIGTERM during the write: %v, want exit 0; stderr: %s", err, stderr.String())
	}
	got, err := direct.Get(ctx, reportKey(date)).Result()
	if err != nil || got != buildReport(date) {
		t.Fatalf("report after a SIGTERM during its write: %q, %v; want it stored", got, err)
	}
}
