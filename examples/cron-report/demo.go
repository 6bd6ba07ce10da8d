package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenure-go/tenure/internal/redisserver"
)

// The demo's timing: the job is expected to take a second, the lock's TTL
// is twice that, and one hour's run takes five seconds, past the TTL twice.
const (
	demoExpected = time.Second
	demoTTL      = 2 * demoExpected
	demoLong     = 5 * time.Second
	// demoGrace is tenure exec's --grace: the time the job gets between
	// SIGTERM and SIGKILL if the lock is lost. tenure exec keeps grace plus
	// TTL/10 of the TTL as a margin, so with a 2 s TTL the default 1 s
	// would leave the watchdog a thin window; a 10 min TTL has room for it.
	demoGrace = 250 * time.Millisecond
	replicas  = 4
)

// runDemo runs the demo: a redis-server, the tenure CLI built once, four
// replicas over three simulated hours, and a summary. It removes everything
// it made.
func runDemo(ctx context.Context, tenureBin string, out io.Writer) error {
	tmp, err := os.MkdirTemp("", "cron-report-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if tenureBin == "" {
		fmt.Fprintln(out, "building the tenure CLI (go build ./cmd/tenure)...")
		if tenureBin, err = buildTenure(ctx, tmp); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	srv, err := redisserver.Start(filepath.Join(tmp, "redis"), redisserver.Options{})
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintf(out, "redis-server on %s; work dir %s\n\n", srv.Addr(), tmp)
	sim := simulation{
		Tenure: tenureBin, Job: []string{self}, Redis: srv.Addr(),
		Dir: filepath.Join(tmp, "work"), Log: out,
	}
	res, err := sim.run(ctx)
	if err != nil {
		// A partial result was never read back from Redis and the run
		// log: summarising it would print claims nobody checked.
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; stopped redis-server, removed %s", tmp)
		}
		return err
	}
	printSummary(out, &sim, res)
	if err := checkDemo(res); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nstopped redis-server, removed %s\n", tmp)
	return nil
}

// checkDemo checks what the summary shows against what the demo claims:
// every hour built exactly once, by a replica that exited 0, the others
// skipped, its report in Redis, no lock key left, and the duplicate run
// leaving the same bytes.
func checkDemo(res *simResult) error {
	var bad []string
	runsOf := map[string]int{}
	for _, r := range res.Runs {
		runsOf[r.Date]++
	}
	for _, h := range res.Hours {
		d := h.Plan.Date
		if n := runsOf[d]; n != 1 {
			bad = append(bad, fmt.Sprintf("hour %s ran %d times, want once", d, n))
		}
		for _, a := range h.Attempts {
			if !a.Skipped && a.Code != 0 {
				bad = append(bad, fmt.Sprintf("hour %s: %s exited %d", d, a.Identity, a.Code))
			}
		}
		if _, ok := res.Reports[reportKey(d)]; !ok {
			bad = append(bad, "no report for "+d)
		}
	}
	if len(res.LockKeys) > 0 {
		bad = append(bad, fmt.Sprintf("lock keys left in Redis: %q", res.LockKeys))
	}
	if res.DupKey != "" && res.DupAfter != res.DupBefore {
		bad = append(bad, "the duplicate run changed "+res.DupKey)
	}
	if len(bad) > 0 {
		return fmt.Errorf("the demo did not show what it claims: %s", strings.Join(bad, "; "))
	}
	return nil
}

// buildTenure builds ./cmd/tenure of the module this example belongs to
// into dir and returns the binary's path.
func buildTenure(ctx context.Context, dir string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w (run the demo from the tenure module, or pass --tenure PATH)", err)
	}
	mod := strings.TrimSpace(string(gomod))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the tenure module (go env GOMOD is empty): run the demo from the module, or pass --tenure PATH")
	}
	bin := filepath.Join(dir, "tenure")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/tenure")
	cmd.Dir = filepath.Dir(mod)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tenure in %s: %w\n%s", cmd.Dir, err, b)
	}
	return bin, nil
}

// simulation runs replicas of the hourly job against one Redis server.
type simulation struct {
	Tenure string   // the tenure binary
	Job    []string // the command that runs this program (report mode is appended)
	Env    []string // extra environment for every replica
	Redis  string   // host:port
	Dir    string   // run log and metrics files
	Log    io.Writer
}

// hourPlan is one simulated hour.
type hourPlan struct {
	Date     string
	Duration time.Duration   // how long the builder's run takes
	Late     []time.Duration // after the hour's start, the replicas that skipped try again
}

// attempt is one `tenure exec` of one replica.
type attempt struct {
	Identity   string
	Wave       int // 0: cron at the top of the hour; 1, 2...: the late tries
	Start, End time.Time
	Code       int
	Stdout     string
	Stderr     string
	Skipped    bool // tenure printed "... is held by ..." and did not run the job
	Metrics    metricCounts
	MetricsErr error
}

// Took is how long the attempt's tenure exec ran.
func (a *attempt) Took() time.Duration { return a.End.Sub(a.Start) }

// hourResult is what one simulated hour did.
type hourResult struct {
	Plan     hourPlan
	Start    time.Time
	Attempts []*attempt
}

// runLine is one line of the job's run log.
type runLine struct {
	Date, Term, Identity string
	Start                time.Time
}

// simResult is what the simulation did.
type simResult struct {
	Hours   []*hourResult
	Runs    []runLine         // the run log after the hours, before the duplicate
	Reports map[string]string // Redis key report:DATE → value
	// LockKeys are the lock keys left in Redis after the hours: none, as
	// every holder released its key when its job exited.
	LockKeys []string
	// Duplicate: the job run once more, without the lock, for the first
	// hour, as if the lock had failed.
	DupKey           string
	DupBefore        string
	DupAfter         string
	ReportsAfterDup  int
	DupRunsOfTheHour int
}

// plan is the demo's three hours: a normal one, a long run that outlives
// its TTL twice while the watchdog extends it (the replicas that skipped
// try again after the TTL has passed once and again later), and a normal
// one.
func plan(now time.Time) []hourPlan {
	h := now.UTC().Truncate(time.Hour)
	return []hourPlan{
		{Date: h.Add(-2 * time.Hour).Format(dateLayout), Duration: demoExpected},
		{Date: h.Add(-time.Hour).Format(dateLayout), Duration: demoLong, Late: []time.Duration{demoTTL + demoTTL/4, 2 * demoTTL}},
		{Date: h.Format(dateLayout), Duration: demoExpected},
	}
}

func (s *simulation) logf(format string, args ...any) {
	if s.Log != nil {
		fmt.Fprintf(s.Log, format, args...)
	}
}

func (s *simulation) runLog() string { return filepath.Join(s.Dir, "runs.log") }

// run simulates the hours one after the other. It returns what happened so
// far even with an error.
func (s *simulation) run(ctx context.Context) (*simResult, error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	res := &simResult{}
	for _, p := range plan(time.Now()) {
		h, err := s.hour(ctx, p)
		res.Hours = append(res.Hours, h)
		if err != nil {
			return res, err
		}
	}
	var err error
	if res.Runs, err = readRunLog(s.runLog()); err != nil {
		return res, err
	}
	c := newRedisClient(s.Redis)
	defer c.Close()
	if res.Reports, err = reports(ctx, c); err != nil {
		return res, err
	}
	if res.LockKeys, err = c.Keys(ctx, "report:*:lock").Result(); err != nil {
		return res, err
	}

	// A duplicate run, as if the lock had failed: no second report.
	first := res.Hours[0].Plan.Date
	res.DupKey = reportKey(first)
	res.DupBefore = res.Reports[res.DupKey]
	s.logf("duplicate: running the job for %s again without the lock, as if the lock had failed\n", first)
	cmd := exec.CommandContext(ctx, s.Job[0], append(slices.Clone(s.Job[1:]), s.reportArgs(first, demoExpected/10)...)...)
	cmd.Env = append(os.Environ(), s.Env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return res, fmt.Errorf("the duplicate run: %w\n%s", err, b)
	}
	after, err := reports(ctx, c)
	if err != nil {
		return res, err
	}
	res.DupAfter, res.ReportsAfterDup = after[res.DupKey], len(after)
	runs, err := readRunLog(s.runLog())
	if err != nil {
		return res, err
	}
	for _, r := range runs {
		if r.Date == first {
			res.DupRunsOfTheHour++
		}
	}
	return res, nil
}

// reportArgs are the job's arguments for date.
func (s *simulation) reportArgs(date string, d time.Duration) []string {
	return []string{"report", "--date", date, "--redis", s.Redis, "--duration", d.String(), "--run-log", s.runLog()}
}

// hour starts the four replicas at once, then the late tries, and waits for
// all of them.
func (s *simulation) hour(ctx context.Context, p hourPlan) (*hourResult, error) {
	h := &hourResult{Plan: p, Start: time.Now()}
	mdir := filepath.Join(s.Dir, "metrics", p.Date)
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return h, err
	}
	s.logf("%s: cron starts replica-1..%d (job %v, --ttl %v, --no-wait)\n", p.Date, replicas, p.Duration, demoTTL)
	var mu sync.Mutex
	var wg sync.WaitGroup
	launch := func(id string, wave int) *attempt {
		a := &attempt{Identity: id, Wave: wave}
		mu.Lock()
		h.Attempts = append(h.Attempts, a)
		mu.Unlock()
		prom := filepath.Join(mdir, id+".prom")
		if wave > 0 {
			prom = filepath.Join(mdir, fmt.Sprintf("%s.late%d.prom", id, wave))
		}
		args := []string{"exec", "--backend", "redis", "--endpoints", s.Redis,
			"--key", reportKey(p.Date) + ":lock", "--ttl", demoTTL.String(), "--grace", demoGrace.String(),
			"--no-wait", "--identity", id, "--metrics-file", prom, "--"}
		args = append(append(args, s.Job...), s.reportArgs(p.Date, p.Duration)...)
		cmd := exec.CommandContext(ctx, s.Tenure, args...)
		cmd.Env = append(os.Environ(), s.Env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.WaitDelay = 5 * time.Second
		wg.Add(1)
		a.Start = time.Now()
		err := cmd.Start()
		go func() {
			defer wg.Done()
			if err == nil {
				err = cmd.Wait()
			}
			end := time.Now()
			code := 0
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				code = ee.ExitCode()
			case err != nil:
				code = -1
				stderr.WriteString(err.Error())
			}
			m, merr := readMetrics(prom)
			mu.Lock()
			defer mu.Unlock()
			a.End, a.Code, a.Stdout, a.Stderr = end, code, stdout.String(), stderr.String()
			a.Skipped = strings.Contains(a.Stderr, " is held by ")
			a.Metrics, a.MetricsErr = m, merr
			what := "ran the job: " + strings.TrimSpace(a.Stdout)
			if a.Skipped {
				what = "skipped (tenure: lock held by " + heldBy(a.Stderr) + ")"
			} else if code != 0 {
				what = "failed: " + strings.TrimSpace(a.Stderr)
			}
			s.logf("  +%5.2fs %s exited %d after %v: %s\n", end.Sub(h.Start).Seconds(), id, code, a.Took().Round(time.Millisecond), what)
		}()
		return a
	}
	var first []*attempt
	for i := 1; i <= replicas; i++ {
		first = append(first, launch(fmt.Sprintf("replica-%d", i), 0))
	}
	for wave, at := range p.Late {
		select {
		case <-time.After(time.Until(h.Start.Add(at))):
		case <-ctx.Done():
			wg.Wait()
			return h, ctx.Err()
		}
		mu.Lock()
		var again []string
		for _, a := range first {
			if a.Skipped {
				again = append(again, a.Identity)
			}
		}
		mu.Unlock()
		s.logf("  +%5.2fs more than the %v TTL since the hour began; the replicas that skipped try again: %s\n",
			time.Since(h.Start).Seconds(), demoTTL, strings.Join(again, ", "))
		for _, id := range again {
			launch(id, wave+1)
		}
	}
	wg.Wait()
	return h, ctx.Err()
}

var heldByRE = regexp.MustCompile(` is held by (.*); not running `)

// heldBy is the holder named by tenure exec's --no-wait message.
func heldBy(stderr string) string {
	if m := heldByRE.FindStringSubmatch(stderr); m != nil {
		return m[1]
	}
	return "?"
}

// reports reads every report:DATE key (not the lock keys, nor tenure's
// :fence token counters).
func reports(ctx context.Context, c *redis.Client) (map[string]string, error) {
	keys, err := c.Keys(ctx, "report:*").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, k := range keys {
		if _, err := time.Parse(dateLayout, strings.TrimPrefix(k, "report:")); err != nil {
			continue
		}
		v, err := c.Get(ctx, k).Result()
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

// readRunLog parses the job's run log; a missing log is empty.
func readRunLog(path string) ([]runLine, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []runLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r runLine
		for _, kv := range strings.Fields(sc.Text()) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "date":
				r.Date = v
			case "term":
				r.Term = v
			case "identity":
				r.Identity = v
			case "start":
				r.Start, _ = time.Parse(time.RFC3339Nano, v)
			}
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// metricCounts are the tenure metrics of one --metrics-file.
type metricCounts struct {
	Acquired         float64 // tenure_transitions_total{reason="elected"}
	Skipped          float64 // tenure_skipped_total
	Expired          float64 // tenure_transitions_total{reason=~"lease_expired|ownership_lost"}
	WatchdogFailures float64 // tenure_watchdog_failures_total
}

func (m metricCounts) String() string {
	return fmt.Sprintf("acquired=%g skipped=%g expired=%g watchdog_failures=%g", m.Acquired, m.Skipped, m.Expired, m.WatchdogFailures)
}

var reasonLabel = regexp.MustCompile(`reason="([^"]*)"`)

// readMetrics sums the tenure series of a Prometheus text file.
func readMetrics(path string) (metricCounts, error) {
	var m metricCounts
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return m, fmt.Errorf("%s: bad line %q", path, line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return m, fmt.Errorf("%s: bad value in %q", path, line)
		}
		series := line[:i]
		name, _, _ := strings.Cut(series, "{")
		reason := ""
		if r := reasonLabel.FindStringSubmatch(series); r != nil {
			reason = r[1]
		}
		switch {
		case name == "tenure_transitions_total" && reason == "elected":
			m.Acquired += v
		case name == "tenure_transitions_total" && (reason == "lease_expired" || reason == "ownership_lost"):
			m.Expired += v
		case name == "tenure_skipped_total":
			m.Skipped += v
		case name == "tenure_watchdog_failures_total":
			m.WatchdogFailures += v
		}
	}
	return m, nil
}

// printSummary prints, per hour, who built, who skipped and how long each
// took, with each --metrics-file's counts.
func printSummary(w io.Writer, s *simulation, res *simResult) {
	fmt.Fprintf(w, "\n=== summary (lock key report:DATE:lock, --ttl %v, --no-wait) ===\n", demoTTL)
	runsOf := map[string][]runLine{}
	for _, r := range res.Runs {
		runsOf[r.Date] = append(runsOf[r.Date], r)
	}
	for _, h := range res.Hours {
		fmt.Fprintf(w, "\nhour %s: job takes %v", h.Plan.Date, h.Plan.Duration)
		if h.Plan.Duration > demoTTL {
			fmt.Fprintf(w, " (longer than the %v TTL: the watchdog extends the lock)", demoTTL)
		}
		fmt.Fprintln(w)
		for _, a := range h.Attempts {
			what := "BUILT  "
			switch {
			case a.Skipped:
				what = "skipped"
			case a.Code != 0:
				what = fmt.Sprintf("FAILED (exit %d)", a.Code)
			}
			late := ""
			if a.Wave > 0 {
				late = fmt.Sprintf(" (late try at +%.1fs)", a.Start.Sub(h.Start).Seconds())
			}
			metrics := a.Metrics.String()
			if a.MetricsErr != nil {
				metrics = "metrics file: " + a.MetricsErr.Error()
			}
			fmt.Fprintf(w, "  %-9s %s exit %d in %6.3fs  %s%s\n", a.Identity, what, a.Code, a.Took().Seconds(), metrics, late)
		}
		var who []string
		for _, r := range runsOf[h.Plan.Date] {
			who = append(who, r.Identity+" (term "+r.Term+")")
		}
		fmt.Fprintf(w, "  run log: %d run(s) of %s: %s\n", len(who), h.Plan.Date, strings.Join(who, ", "))
		if v, ok := res.Reports[reportKey(h.Plan.Date)]; ok {
			fmt.Fprintf(w, "  redis: %s = %q\n", reportKey(h.Plan.Date), v)
		} else {
			fmt.Fprintf(w, "  redis: %s is MISSING\n", reportKey(h.Plan.Date))
		}
	}
	fmt.Fprintf(w, "\nlock keys left in Redis: %d %q (tenure's report:DATE:lock:fence token counters stay)\n", len(res.LockKeys), res.LockKeys)
	if res.DupKey != "" {
		same := "the same bytes"
		if res.DupAfter != res.DupBefore {
			same = "DIFFERENT bytes"
		}
		fmt.Fprintf(w, "\nduplicate run of %s without the lock: %d run(s) of that hour in the run log, %d report keys before and %d after; %s holds %s\n",
			strings.TrimPrefix(res.DupKey, "report:"), res.DupRunsOfTheHour, len(res.Reports), res.ReportsAfterDup, res.DupKey, same)
	}
}
