package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/template"
	"time"
)

//go:embed report.md.tmpl
var reportTemplate string

// backend is one backend's handoff benchmark and its implementations.
type backend struct {
	Name   string // "etcd"
	Bench  string // "BenchmarkHandoff"
	Tenure string // tenure's impl name
	Peers  []string
	Reqs   string // the server-requests metric
}

var backends = []backend{
	{"etcd", "BenchmarkHandoff", "tenure", []string{"etcd-election", "etcd-mutex", "etcdctl-lock"}, "etcd-reqs/handoff"},
	{"zookeeper", "BenchmarkZKHandoff", "tenure", []string{"gozk-lock", "curator", "kazoo"}, "zk-reqs/handoff"},
	{"redis", "BenchmarkRedisHandoff", "tenure-redis", []string{"redsync", "bsm-redislock"}, "redis-cmds/handoff"},
}

var labels = map[string]string{
	"tenure":        "**tenure**",
	"tenure-redis":  "**tenure**",
	"etcd-election": "concurrency.Election",
	"etcd-mutex":    "concurrency.Mutex",
	"etcdctl-lock":  "`etcdctl lock`",
	"gozk-lock":     "go-zookeeper Lock",
	"curator":       "Curator InterProcessMutex",
	"kazoo":         "kazoo Lock",
	"redsync":       "redsync",
	"bsm-redislock": "bsm/redislock",
	"tenure-etcd":   "**tenure exec** (etcd)",
	"tenure-zk":     "**tenure exec** (ZooKeeper)",
}

// flabel labels the failover benchmarks' implementations (processes).
func flabel(impl string) string {
	if impl == "tenure-redis" {
		return "**tenure exec** (Redis)"
	}
	return label(impl)
}

func label(impl string) string {
	if l, ok := labels[impl]; ok {
		return l
	}
	return impl
}

// report is what the template sees.
type report struct {
	rs      *results
	Title   string
	Command string
	Date    string
	Machine string
	Version string
	Plots   map[string]string // plot name → path relative to the report
	// Rounds is the most rounds any handoff sub-benchmark ran
	// (-bench.repeat); each handoff figure is the median over them.
	Rounds int
}

func newReport(rs *results, command, title string) *report {
	rounds := 1
	for _, r := range rs.byName {
		rounds = max(rounds, len(r.rounds))
	}
	return &report{rs: rs, Title: title, Command: command,
		Date:    reportDate(time.Now()),
		Machine: machine(), Version: versionTable(versionRows()), Rounds: rounds}
}

// reportDate is how the report dates a run.
func reportDate(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") }

func (r *report) render() ([]byte, error) {
	t, err := template.New("report").Funcs(template.FuncMap{
		"handoffTable":  r.handoffTable,
		"goalsTable":    r.goalsTable,
		"failoverTable": func() string { return r.failoverTable() },
		"pauseTable":    func() string { return r.pauseTable() },
		"costTable":     r.costTable,
		"zkSplitTable":  r.zkSplitTable,
		"m":             r.metric,
		"rounds":        r.roundsOf,
		"ratio":         r.ratio,
		"plot":          r.plot,
		"notes":         r.notesList,
	}).Parse(reportTemplate)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (r *report) backend(name string) backend {
	for _, b := range backends {
		if b.Name == name {
			return b
		}
	}
	panic("benchreport: no backend " + name)
}

// counts returns the contender counts that bench has results for.
func (r *report) counts(bench string) []int {
	var ns []int
	for _, res := range r.rs.byName {
		if res.bench == bench && res.contenders > 0 && !slices.Contains(ns, res.contenders) {
			ns = append(ns, res.contenders)
		}
	}
	slices.Sort(ns)
	return ns
}

// fmtNum formats v with about three significant digits.
func fmtNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// cell is one table cell for res's unit: the figure, or why there is none.
func cell(res *result, unit string) string {
	switch {
	case res == nil:
		return "not run"
	case res.failed:
		return "**failed**"
	case res.skipped:
		return "not feasible"
	}
	v, ok := res.metrics[unit]
	if !ok {
		return "–"
	}
	return fmtNum(v)
}

// best returns the best peer's value of unit at n (lowest, or highest when
// high), and which peer it is.
func (r *report) best(b backend, n int, unit string, high bool) (float64, string) {
	bv, bp := math.NaN(), ""
	for _, p := range b.Peers {
		res := r.rs.lookup(b.Bench, p, n)
		if res == nil || res.failed || res.skipped || !res.has(unit) {
			continue
		}
		v := res.metrics[unit]
		if math.IsNaN(bv) || (high && v > bv) || (!high && v < bv) {
			bv, bp = v, p
		}
	}
	return bv, bp
}

// result finds impl's result at n contenders on the backend named bname
// (or in the benchmark named bname), or nil.
func (r *report) result(bname, impl string, n int) *result {
	bench := bname
	if b := r.findBackend(bname); b != nil {
		bench = b.Bench
	}
	return r.rs.lookup(bench, impl, n)
}

// metric returns a figure for the prose: m "zookeeper" "tenure" 100 "p50-ms".
func (r *report) metric(bname, impl string, n int, unit string) string {
	return cell(r.result(bname, impl, n), unit)
}

// roundsOf lists a figure's value in each round, in the order the rounds
// ran ("0.41 / 0.66 / 0.53"), or the single value when there were none.
func (r *report) roundsOf(bname, impl string, n int, unit string) string {
	res := r.result(bname, impl, n)
	if res == nil || len(res.rounds) == 0 {
		return cell(res, unit)
	}
	var vs []string
	for _, m := range res.rounds {
		if v, ok := m[unit]; ok {
			vs = append(vs, fmtNum(v))
		}
	}
	if len(vs) == 0 {
		return "–"
	}
	return strings.Join(vs, " / ")
}

func (r *report) findBackend(name string) *backend {
	for i := range backends {
		if backends[i].Name == name {
			return &backends[i]
		}
	}
	return nil
}

// ratio returns tenure's figure over the best peer's at n, for the prose.
func (r *report) ratio(bname string, n int, unit string) string {
	b := r.backend(bname)
	t := r.rs.lookup(b.Bench, b.Tenure, n)
	bv, _ := r.best(b, n, unit, unit == "handoffs/s")
	if t == nil || !t.has(unit) || math.IsNaN(bv) || bv == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", t.metrics[unit]/bv)
}

// handoffTable is one backend's handoff figures: every implementation at
// every contender count, with tenure's ratios to the best peer.
func (r *report) handoffTable(bname string) string {
	b := r.backend(bname)
	var sb strings.Builder
	fmt.Fprintf(&sb, "| contenders | implementation | p50 ms | p99 ms | acquires/s | p50 ÷ best peer | p99 ÷ best peer | acquires/s ÷ best peer |\n")
	fmt.Fprintf(&sb, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, n := range r.counts(b.Bench) {
		for _, impl := range append([]string{b.Tenure}, b.Peers...) {
			res := r.rs.lookup(b.Bench, impl, n)
			ratios := " |  | "
			if impl == b.Tenure && res != nil && !res.failed && !res.skipped {
				var rs []string
				for _, u := range []string{"p50-ms", "p99-ms", "handoffs/s"} {
					bv, bp := r.best(b, n, u, u == "handoffs/s")
					if math.IsNaN(bv) || bv == 0 || !res.has(u) {
						rs = append(rs, "–")
						continue
					}
					rs = append(rs, fmt.Sprintf("%.2f (%s)", res.metrics[u]/bv, shortLabel(bp)))
				}
				ratios = strings.Join(rs, " | ")
			}
			note := ""
			if res != nil && res.has("handoffs") && (n >= 1000 || bname == "zookeeper") {
				note = fmt.Sprintf(" (%d handoffs)", int(res.metrics["handoffs"]))
			}
			fmt.Fprintf(&sb, "| %d | %s%s | %s | %s | %s | %s |\n", n, label(impl), note,
				cell(res, "p50-ms"), cell(res, "p99-ms"), cell(res, "handoffs/s"), ratios)
		}
	}
	return sb.String()
}

func shortLabel(impl string) string {
	return strings.Trim(strings.TrimSuffix(label(impl), " InterProcessMutex"), "*`")
}

// costTable is the cost per candidate and per handoff at n contenders
// (every backend).
func (r *report) costTable(n int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| backend | implementation | heap KB per idle candidate | goroutines per candidate | RSS KB per candidate (processes) | server requests per handoff |\n")
	fmt.Fprintf(&sb, "| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, b := range backends {
		for _, impl := range append([]string{b.Tenure}, b.Peers...) {
			res := r.rs.lookup(b.Bench, impl, n)
			fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s |\n", b.Name, label(impl),
				cell(res, "heap-KB/candidate"), cell(res, "goroutines/candidate"), cell(res, "rss-KB/candidate"), cell(res, b.Reqs))
		}
	}
	return sb.String()
}

// zkSplitTable is the ZooKeeper handoff split on the wire (see
// test/zkwire_test.go) and the CPU time per handoff, for every contender
// count and implementation; the drivers (Curator, kazoo) have the server's
// CPU time only.
func (r *report) zkSplitTable() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| contenders | implementation | release µs | commit µs (server) | wake µs | read µs (server) | elect µs | client µs | requeue µs | handoffs split | ZooKeeper CPU µs per handoff | Go CPU µs per handoff |\n")
	fmt.Fprintf(&sb, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	zk := r.backend("zookeeper")
	for _, n := range r.counts(zk.Bench) {
		for _, impl := range append([]string{zk.Tenure}, zk.Peers...) {
			res := r.rs.lookup(zk.Bench, impl, n)
			if res == nil || res.skipped {
				continue
			}
			fmt.Fprintf(&sb, "| %d | %s |", n, label(impl))
			for _, u := range []string{"release-us", "commit-us", "wake-us", "read-us", "elect-us", "client-us", "requeue-us", "split", "zk-cpu-us/handoff", "go-cpu-us/handoff"} {
				fmt.Fprintf(&sb, " %s |", cell(res, u))
			}
			sb.WriteString("\n")
		}
	}
	return sb.String()
}

// goalsTable checks the goals, met or not.
func (r *report) goalsTable() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| goal | contenders | measured | met |\n| --- | ---: | --- | :---: |\n")
	row := func(goal string, n int, measured string, ok, known bool) {
		met := "–"
		if known {
			met = map[bool]string{true: "yes", false: "**no**"}[ok]
		}
		fmt.Fprintf(&sb, "| %s | %d | %s | %s |\n", goal, n, measured, met)
	}
	get := func(bench, impl string, n int, unit string) (float64, bool) {
		res := r.rs.lookup(bench, impl, n)
		if res == nil || res.failed || res.skipped || !res.has(unit) {
			return math.NaN(), false
		}
		return res.metrics[unit], true
	}
	etcd := r.backend("etcd")
	for _, n := range r.counts(etcd.Bench) {
		t99, ok1 := get(etcd.Bench, "tenure", n, "p99-ms")
		r99, ok2 := get(etcd.Bench, "etcd-election", n, "p99-ms")
		row("etcd p99 ≤ 0.2 × concurrency.Election", n, fmt.Sprintf("%s / %s ms = %.2f ×", fmtNum(t99), fmtNum(r99), t99/r99), t99 <= 0.2*r99, ok1 && ok2)
		t50, ok1 := get(etcd.Bench, "tenure", n, "p50-ms")
		r50, ok2 := get(etcd.Bench, "etcd-election", n, "p50-ms")
		row("etcd p50 ≤ 1.0 × concurrency.Election", n, fmt.Sprintf("%s / %s ms = %.2f ×", fmtNum(t50), fmtNum(r50), t50/r50), t50 <= r50, ok1 && ok2)
	}
	zk := r.backend("zookeeper")
	for _, n := range r.counts(zk.Bench) {
		for _, u := range []string{"p50-ms", "p99-ms", "handoffs/s"} {
			high := u == "handoffs/s"
			t, ok := get(zk.Bench, "tenure", n, u)
			bv, bp := r.best(zk, n, u, high)
			met := t <= bv
			goal := "ZooKeeper " + strings.TrimSuffix(u, "-ms") + " ≤ 1.0 × best peer"
			if high {
				met = t >= bv
				goal = "ZooKeeper acquires/s ≥ best peer"
			}
			row(goal, n, fmt.Sprintf("%s vs %s (%s) = %.2f ×", fmtNum(t), fmtNum(bv), shortLabel(bp), t/bv), met, ok && !math.IsNaN(bv))
		}
	}
	rd := r.backend("redis")
	for _, n := range r.counts(rd.Bench) {
		t, ok1 := get(rd.Bench, rd.Tenure, n, "p99-ms")
		rv, ok2 := get(rd.Bench, "redsync", n, "p99-ms")
		row("Redis p99 ≤ 0.1 × redsync", n, fmt.Sprintf("%s / %s ms = %.3f ×", fmtNum(t), fmtNum(rv), t/rv), t <= 0.1*rv, ok1 && ok2)
	}
	for _, b := range backends {
		ns := r.counts(b.Bench)
		if len(ns) < 2 || ns[0] != 2 || ns[len(ns)-1] < 1000 {
			continue
		}
		big := ns[len(ns)-1]
		t2, ok1 := get(b.Bench, b.Tenure, 2, "p50-ms")
		tb, ok2 := get(b.Bench, b.Tenure, big, "p50-ms")
		row(b.Name+" p50 at 1,000 contenders ≤ 1.5 × at 2", big, fmt.Sprintf("%s / %s ms = %.2f ×", fmtNum(tb), fmtNum(t2), tb/t2), tb <= 1.5*t2, ok1 && ok2)
	}
	for _, impl := range []string{"tenure-etcd", "tenure-zk", "tenure-redis"} {
		fo, ok1 := get("BenchmarkFailover", impl, 0, "failover-max-ms")
		ttl, ok2 := get("BenchmarkFailover", impl, 0, "ttl-ms")
		bound := 1.1*ttl + 300
		row("crash failover ≤ 1.1 × TTL + 0.3 s ("+flabel(impl)+", worst round)", 2, fmt.Sprintf("%s ms vs bound %s ms (TTL %s ms)", fmtNum(fo), fmtNum(bound), fmtNum(ttl)), fo <= bound, ok1 && ok2)
	}
	return sb.String()
}

var failoverImpls = []string{"tenure-etcd", "tenure-zk", "tenure-redis", "etcdctl-lock", "kazoo"}

func (r *report) failoverTable() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| implementation | TTL ms | failover ms (median) | worst | median ÷ TTL | rounds |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, impl := range failoverImpls {
		res := r.rs.lookup("BenchmarkFailover", impl, 0)
		ratio := "–"
		if res != nil && res.has("failover-ms") && res.metrics["ttl-ms"] > 0 {
			ratio = fmt.Sprintf("%.2f", res.metrics["failover-ms"]/res.metrics["ttl-ms"])
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s |\n", flabel(impl), cell(res, "ttl-ms"), cell(res, "failover-ms"), cell(res, "failover-max-ms"), ratio, cell(res, "rounds"))
	}
	return sb.String()
}

func (r *report) pauseTable() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| implementation | TTL ms | new holder's command started after the freeze (ms) | old command ran on after the resume (ms) |\n| --- | ---: | ---: | --- |\n")
	for _, impl := range failoverImpls {
		res := r.rs.lookup("BenchmarkPauseOverlap", impl, 0)
		if res == nil {
			continue
		}
		ov := cell(res, "overlap-ms")
		if res.has("stopped") && res.metrics["stopped"] == 0 {
			ov = fmt.Sprintf("still running at the end of the %s ms window: **never stopped**", fmtNum(res.metrics["window-ms"]))
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", flabel(impl), cell(res, "ttl-ms"), cell(res, "takeover-ms"), ov)
	}
	return sb.String()
}

// notesList lists why cells are empty: the skips' and failures' messages.
func (r *report) notesList() string {
	var sb strings.Builder
	for _, k := range r.rs.order {
		res := r.rs.byName[k]
		if !res.failed && !res.skipped {
			continue
		}
		what := "not run"
		if res.failed {
			what = "**failed**"
		}
		name := res.bench + " " + label(res.impl)
		if res.contenders > 0 {
			name += fmt.Sprintf(" at %d contenders", res.contenders)
		}
		msg := strings.Join(res.notes, " ")
		if len(msg) > 400 {
			msg = msg[:400] + "…"
		}
		fmt.Fprintf(&sb, "- %s, %s: %s\n", name, what, msg)
	}
	if sb.Len() == 0 {
		return "- none: every cell was measured.\n"
	}
	return sb.String()
}

func (r *report) plot(name, alt string) string {
	p, ok := r.Plots[name]
	if !ok {
		return ""
	}
	return fmt.Sprintf("![%s](%s)", alt, p)
}

// machine describes the machine: nproc, CPU model, memory.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := "unknown memory"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb float64
				fmt.Sscanf(strings.TrimSpace(v), "%f", &kb)
				mem = fmt.Sprintf("%.1f GiB memory", kb/1024/1024)
			}
		}
	}
	nproc := fmt.Sprint(runtime.NumCPU())
	if out, err := exec.Command("nproc").Output(); err == nil {
		nproc = strings.TrimSpace(string(out))
	}
	return fmt.Sprintf("%s (`nproc` %s), %s, %s/%s", cpu, nproc, mem, runtime.GOOS, runtime.GOARCH)
}

// versionRows lists the servers', the peers' and the toolchain's versions
// on this machine: component, version.
func versionRows() [][2]string {
	cmd := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return "unknown"
		}
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return strings.TrimSpace(line)
	}
	deb := func(pkg string) string { return cmd("dpkg-query", "-W", "-f=${Version}", pkg) }
	mods := map[string]string{}
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Path}} {{.Version}}{{with .Replace}} (patched copy in {{.Path}}){{end}}",
		"go.etcd.io/etcd/server/v3", "go.etcd.io/etcd/client/v3", "github.com/go-zookeeper/zk",
		"github.com/go-redsync/redsync/v4", "github.com/bsm/redislock", "github.com/redis/go-redis/v9").Output(); err == nil {
		for line := range strings.Lines(string(out)) {
			if p, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
				mods[p] = v
			}
		}
	}
	etcdctl := "unknown"
	if out, err := exec.Command("go", "list", "-C", "test/testdata/etcdctl", "-m", "-f", "{{.Version}}", "go.etcd.io/etcd/etcdctl/v3").Output(); err == nil {
		etcdctl = strings.TrimSpace(string(out))
	}
	redis := cmd("redis-server", "--version")
	if f := strings.Fields(redis); len(f) > 2 {
		redis = strings.TrimPrefix(f[2], "v=")
	}
	rows := [][2]string{
		{"Go", runtime.Version()},
		{"etcd server (embedded) / client", mods["go.etcd.io/etcd/server/v3"] + " / " + mods["go.etcd.io/etcd/client/v3"]},
		{"etcdctl", etcdctl + " (built from test/testdata/etcdctl)"},
		{"ZooKeeper (Debian package)", deb("zookeeper")},
		{"go-zookeeper", mods["github.com/go-zookeeper/zk"]},
		{"Curator (Debian libcurator-recipes-java)", deb("libcurator-recipes-java")},
		{"Java", cmd("java", "-version")},
		{"kazoo (Debian python3-kazoo)", deb("python3-kazoo")},
		{"Python", cmd("/usr/bin/python3", "--version")},
		{"Redis", redis},
		{"go-redis / redsync / bsm/redislock", mods["github.com/redis/go-redis/v9"] + " / " + mods["github.com/go-redsync/redsync/v4"] + " / " + mods["github.com/bsm/redislock"]},
	}
	return rows
}

// versionTable is the report's table of versions.
func versionTable(rows [][2]string) string {
	var sb strings.Builder
	sb.WriteString("| component | version |\n| --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %s | %s |\n", r[0], r[1])
	}
	return sb.String()
}
