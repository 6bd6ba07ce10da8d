package test

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The benchmarks' shared flags (pass them after -args). make bench and
// make bench-quick set them; the defaults keep the smoke run in
// scripts/test.sh short.
var (
	benchContenders = flag.String("bench.contenders", "2,10,100", "comma-separated contender counts of the handoff benchmarks (make bench adds 1000)")
	benchBigCount   = flag.Int("bench.big", 200, "timed handoffs at 1,000 or more contenders, when fewer than -benchtime's count")
	benchBigWarm    = flag.Int("bench.bigwarm", 50, "untimed warm-up handoffs at 1,000 or more contenders, when fewer than -zkbench.warmup")
	benchRepeat     = flag.Int("bench.repeat", 1, "rounds of the handoff benchmarks per contender count: each round runs every implementation once, in a balanced (Williams) order over the rounds (benchreport reports each figure's median over the rounds)")
)

// interleaved runs the handoff sub-benchmarks for n contenders: one
// "impl=<name>/contenders=<n>" per implementation, in -bench.repeat rounds
// ("/round=<r>" added when there is more than one). The rounds follow a
// balanced (Williams) order: over m rounds for m implementations (2m when
// m is odd), each implementation runs first once and right after each of
// the others once, so that none always runs first (on the coldest server)
// or always right after the same peer, and a slow spell of a shared
// machine falls on different implementations in different rounds. Fewer
// rounds take the first rows of that order.
func interleaved[I any](b *testing.B, n int, impls []I, name func(I) string, run func(*testing.B, I)) {
	rounds := max(*benchRepeat, 1)
	for r := range rounds {
		for _, i := range roundOrder(len(impls), r) {
			im := impls[i]
			sub := fmt.Sprintf("impl=%s/contenders=%d", name(im), n)
			if rounds > 1 {
				sub += fmt.Sprintf("/round=%d", r+1)
			}
			b.Run(sub, func(b *testing.B) {
				if probeRun(b) {
					return
				}
				run(b, im)
			})
		}
	}
}

// roundOrder returns the order of m implementations in round r of a
// Williams design: the first row is 0, 1, m-1, 2, m-2, ..., row r adds r
// to each (mod m); for odd m, rows m to 2m-1 are the first m reversed.
// Over one period (m rows, or 2m for odd m) every implementation comes
// first equally often and follows every other equally often.
func roundOrder(m, r int) []int {
	if m <= 0 {
		return nil
	}
	period := m
	if m%2 == 1 {
		period = 2 * m
	}
	r %= period
	row := make([]int, m)
	lo, hi := 1, m-1
	for k := range row {
		var a int
		switch {
		case k == 0:
			a = 0
		case k%2 == 1:
			a, lo = lo, lo+1
		default:
			a, hi = hi, hi-1
		}
		row[k] = (a + r%m) % m
	}
	if r >= m {
		slices.Reverse(row)
	}
	return row
}

// contenderCounts parses -bench.contenders.
func contenderCounts(b *testing.B) []int {
	var ns []int
	for f := range strings.SplitSeq(*benchContenders, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("-bench.contenders %q: %q is not a positive count", *benchContenders, f)
		}
		ns = append(ns, n)
	}
	return ns
}

// bigRun is the contender count from which runs time fewer handoffs.
const bigRun = 1000

// timedCount is the number of timed handoffs of a run with n contenders:
// b.N, or at most -bench.big from bigRun contenders on. The metric
// "handoffs" says which.
func timedCount(b *testing.B, n int) int {
	if n >= bigRun && *benchBigCount > 0 && *benchBigCount < b.N {
		return *benchBigCount
	}
	return b.N
}

// warmCount is the number of untimed warm-up handoffs with n contenders.
func warmCount(warm, n int) int {
	if n >= bigRun && *benchBigWarm < warm {
		return *benchBigWarm
	}
	return warm
}

// liveHeap returns the live heap after a full collection, and the number
// of goroutines.
func liveHeap() (heap uint64, goroutines int) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, runtime.NumGoroutine()
}

// memCost measures, for contenders of this process, the live heap and the
// goroutines each idle candidate adds: mark before the contenders (and
// their clients) are created, report once they all wait in the queue.
// With etcd the embedded server shares the heap, so its per-watcher and
// per-lease state is counted too.
type memCost struct {
	heap uint64
	gs   int
	n    int
}

func (m *memCost) mark(n int) { m.heap, m.gs = liveHeap(); m.n = n }

func (m *memCost) measure() []metric {
	heap, gs := liveHeap()
	return []metric{
		{(float64(heap) - float64(m.heap)) / 1024 / float64(m.n), "heap-KB/candidate"},
		{float64(gs-m.gs) / float64(m.n), "goroutines/candidate"},
	}
}

// metric is a figure measured before b.ResetTimer (which drops reported
// metrics), reported at the end.
type metric struct {
	v    float64
	unit string
}

func reportMetrics(b *testing.B, ms []metric) {
	for _, m := range ms {
		b.ReportMetric(m.v, m.unit)
	}
}

// rssKB returns the resident set of process pid in KiB (Linux), or 0.
func rssKB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return f
		}
	}
	return 0
}

// etcdServerRequests returns the requests the package's embedded etcd
// server has received: unary gRPC calls (Range, Put, DeleteRange, Txn,
// LeaseGrant, ...) plus the messages received on watch streams (creates
// and cancels), from the gRPC server metrics etcd registers with the
// default Prometheus registry. Lease keep-alives are left out: they are a
// steady background (one per candidate every TTL/3) that has nothing to do
// with the handoffs, and would make the slower runs look costlier.
func etcdServerRequests() (float64, error) {
	by, err := etcdRequestsByMethod()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, v := range by {
		total += v
	}
	return total, nil
}

// etcdRequestsByMethod is etcdServerRequests by gRPC method.
func etcdRequestsByMethod() (map[string]float64, error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return nil, err
	}
	by := map[string]float64{}
	found := false
	method := func(m interface {
		GetLabel() []*dto.LabelPair
	}) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == "grpc_method" {
				return l.GetValue()
			}
		}
		return "?"
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "grpc_server_started_total":
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "grpc_type" && l.GetValue() == "unary" {
						by[method(m)] += m.GetCounter().GetValue()
						found = true
					}
				}
			}
		case "grpc_server_msg_received_total":
			for _, m := range mf.GetMetric() {
				stream, keepAlive := false, false
				for _, l := range m.GetLabel() {
					stream = stream || (l.GetName() == "grpc_type" && l.GetValue() != "unary")
					keepAlive = keepAlive || (l.GetName() == "grpc_method" && l.GetValue() == "LeaseKeepAlive")
				}
				if stream && !keepAlive {
					by[method(m)+" (stream msgs)"] += m.GetCounter().GetValue()
					found = true
				}
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("no grpc_server_* metrics in the default registry (etcd's gRPC metrics)")
	}
	return by, nil
}

var benchBreakdown = flag.Bool("bench.breakdown", false, "log the server requests per handoff by method (etcd) or command (Redis)")

// serverRequests counts a server's requests over the timed part of a run,
// less those the harness itself sent (extra, read at the end). With
// -bench.breakdown, byKind (when set) is logged per request kind.
type serverRequests struct {
	read   func() (float64, error)
	byKind func() (map[string]float64, error)
	unit   string
	extra  func() float64
	start  float64
	kinds  map[string]float64
	n      int
}

func (r *serverRequests) begin(b *testing.B) {
	v, err := r.read()
	if err != nil {
		b.Fatalf("%s: %v", r.unit, err)
	}
	r.start = v
	if *benchBreakdown && r.byKind != nil {
		r.kinds, _ = r.byKind()
	}
}

func (r *serverRequests) logKinds(b *testing.B) {
	if !*benchBreakdown || r.byKind == nil || r.kinds == nil {
		return
	}
	now, err := r.byKind()
	if err != nil {
		return
	}
	var parts []string
	for k, v := range now {
		if d := (v - r.kinds[k]) / float64(r.n); d >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, d))
		}
	}
	slices.Sort(parts)
	b.Logf("%s by kind: %s", r.unit, strings.Join(parts, ", "))
}

func (r *serverRequests) report(b *testing.B) {
	v, err := r.read()
	if err != nil {
		b.Fatalf("%s: %v", r.unit, err)
	}
	if r.extra != nil {
		v -= r.extra()
	}
	r.logKinds(b)
	b.ReportMetric((v-r.start)/float64(r.n), r.unit)
}

// probeRun reports whether this is the testing package's first, one-op
// run of a sub-benchmark that -benchtime Nx (N > 1) will run again with
// b.N = N: the expensive setups (1,000 contenders, real processes) skip it.
func probeRun(b *testing.B) bool {
	if b.N != 1 {
		return false
	}
	f := flag.Lookup("test.benchtime")
	if f == nil {
		return false
	}
	v, ok := strings.CutSuffix(f.Value.String(), "x")
	if !ok {
		return false
	}
	n, err := strconv.Atoi(v)
	return err == nil && n > 1
}

// walFsyncs reads the embedded etcd's WAL fsync histogram from the
// default registry: how many fsyncs, and how many took over 2 ms.
func walFsyncs() (total, over2ms float64, err error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "etcd_disk_wal_fsync_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			total += float64(h.GetSampleCount())
			var upTo2ms float64
			for _, bk := range h.GetBucket() {
				if bk.GetUpperBound() <= 0.002 {
					upTo2ms = float64(bk.GetCumulativeCount())
				}
			}
			over2ms += float64(h.GetSampleCount()) - upTo2ms
		}
		return total, over2ms, nil
	}
	return 0, 0, fmt.Errorf("no etcd_disk_wal_fsync_duration_seconds in the default registry")
}

// fsyncMeter reports the embedded etcd's WAL fsyncs over the timed
// handoffs: wal-fsyncs/handoff, and wal-fsync-over-2ms, the share of them
// that took over 2 ms (a handoff waits for at least one: the release's
// delete).
type fsyncMeter struct {
	total, over float64
	n           int
}

func (f *fsyncMeter) begin(b *testing.B) {
	var err error
	if f.total, f.over, err = walFsyncs(); err != nil {
		b.Fatal(err)
	}
}

func (f *fsyncMeter) report(b *testing.B) {
	total, over, err := walFsyncs()
	if err != nil {
		b.Fatal(err)
	}
	if d := total - f.total; d > 0 && f.n > 0 {
		b.ReportMetric(d/float64(f.n), "wal-fsyncs/handoff")
		b.ReportMetric((over-f.over)/d, "wal-fsync-over-2ms")
	}
}
