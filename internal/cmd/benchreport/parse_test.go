package main

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseRoundsMedian: figures of a sub-benchmark that ran in rounds are
// the median of the rounds, a note every round repeats is kept once, a
// failure in any round marks the result failed, and a run without rounds
// keeps its figures as they are.
func TestParseRoundsMedian(t *testing.T) {
	out := `goos: linux
BenchmarkZKHandoff/impl=tenure/contenders=10/round=1-2         	     300	    700000 ns/op	         0.60 p50-ms	         4.0 p99-ms	      1400 handoffs/s
--- BENCH: BenchmarkZKHandoff/impl=tenure/contenders=10/round=1-2
    zk_bench_test.go:99: warm-up 300 handoffs
BenchmarkZKHandoff/impl=gozk-lock/contenders=10/round=1-2      	     300	    700000 ns/op	         0.50 p50-ms	         3.0 p99-ms	      1500 handoffs/s
BenchmarkZKHandoff/impl=gozk-lock/contenders=10/round=2-2      	     300	    700000 ns/op	         0.70 p50-ms	         9.0 p99-ms	      1100 handoffs/s
BenchmarkZKHandoff/impl=tenure/contenders=10/round=2-2         	     300	    700000 ns/op	         0.40 p50-ms	         2.0 p99-ms	      1900 handoffs/s
--- BENCH: BenchmarkZKHandoff/impl=tenure/contenders=10/round=2-2
    zk_bench_test.go:99: warm-up 300 handoffs
BenchmarkZKHandoff/impl=tenure/contenders=10/round=3-2         	     300	    700000 ns/op	         0.90 p50-ms	         8.0 p99-ms	      1000 handoffs/s
BenchmarkZKHandoff/impl=gozk-lock/contenders=10/round=3-2      	     300	    700000 ns/op	         0.55 p50-ms	         5.0 p99-ms	      1300 handoffs/s
--- FAIL: BenchmarkZKHandoff/impl=curator/contenders=10/round=2-2
    zk_bench_test.go:600: two holders
BenchmarkHandoff/impl=tenure/contenders=2-2         	     300	    900000 ns/op	         0.80 p50-ms	         3.0 p99-ms
`
	rs, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	check := func(bench, impl string, n int, unit string, want float64) {
		t.Helper()
		r := rs.lookup(bench, impl, n)
		if r == nil {
			t.Fatalf("no result %s/%s/%d", bench, impl, n)
		}
		if got := r.metrics[unit]; got != want {
			t.Errorf("%s/%s/%d %s = %v, want %v", bench, impl, n, unit, got, want)
		}
	}
	check("BenchmarkZKHandoff", "tenure", 10, "p50-ms", 0.60)
	check("BenchmarkZKHandoff", "tenure", 10, "p99-ms", 4.0)
	check("BenchmarkZKHandoff", "tenure", 10, "handoffs/s", 1400)
	check("BenchmarkZKHandoff", "gozk-lock", 10, "p50-ms", 0.55)
	check("BenchmarkZKHandoff", "gozk-lock", 10, "p99-ms", 5.0)
	check("BenchmarkHandoff", "tenure", 2, "p50-ms", 0.80)
	if r := rs.lookup("BenchmarkZKHandoff", "tenure", 10); len(r.rounds) != 3 || len(r.notes) != 1 {
		t.Errorf("tenure: %d rounds, notes %q; want 3 rounds and the repeated note once", len(r.rounds), r.notes)
	}
	if r := rs.lookup("BenchmarkZKHandoff", "curator", 10); r == nil || !r.failed {
		t.Errorf("curator = %+v, want failed", r)
	}
	if !rs.failed {
		t.Error("a FAIL line did not fail the run")
	}
	rep := newReport(rs, "", "")
	if rep.Rounds != 3 {
		t.Errorf("report Rounds = %d, want 3", rep.Rounds)
	}
	if got, want := rep.roundsOf("zookeeper", "tenure", 10, "p50-ms"), fmtNum(0.6)+" / "+fmtNum(0.4)+" / "+fmtNum(0.9); got != want {
		t.Errorf("roundsOf = %q, want %q (in the order the rounds ran)", got, want)
	}
}

// TestParseFailureOnTheNameLine: a sub-benchmark that fails before it
// reports prints its name and "--- FAIL:" on one line; the result is
// failed (so the report shows the cell failed, with the message), not the
// median of its other rounds.
func TestParseFailureOnTheNameLine(t *testing.T) {
	out := "BenchmarkZKHandoff/impl=kazoo/contenders=1000/round=1-2 \t     300\t  22405400 ns/op\t        20.48 p50-ms\n" +
		"BenchmarkZKHandoff/impl=kazoo/contenders=1000/round=2-2 \t--- FAIL: BenchmarkZKHandoff/impl=kazoo/contenders=1000/round=2-2\n" +
		"    zk_bench_test.go:675: contenders not all queued\n" +
		"        WARNING:kazoo.client:Session has expired\n" +
		"BenchmarkZKHandoff/impl=kazoo/contenders=1000/round=3-2 \t     300\t  14681874 ns/op\t        12.51 p50-ms\n"
	rs, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	r := rs.lookup("BenchmarkZKHandoff", "kazoo", 1000)
	if r == nil || !r.failed {
		t.Fatalf("kazoo at 1000 = %+v, want failed", r)
	}
	if !rs.failed {
		t.Error("the failed round did not fail the run")
	}
	if !slices.Contains(r.notes, "contenders not all queued") {
		t.Errorf("notes %q lack the failure's message", r.notes)
	}
	if got := cell(r, "p50-ms"); got != "**failed**" {
		t.Errorf("the report's cell = %q, want **failed**", got)
	}
}

// TestParseRoundsEvenCount: with an even number of rounds the median is the
// mean of the middle two.
func TestParseRoundsEvenCount(t *testing.T) {
	out := `BenchmarkRedisHandoff/impl=redsync/contenders=2/round=1-2 	 300	 1 ns/op	 100 p99-ms
BenchmarkRedisHandoff/impl=redsync/contenders=2/round=2-2 	 300	 1 ns/op	 300 p99-ms
`
	rs, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.lookup("BenchmarkRedisHandoff", "redsync", 2).metrics["p99-ms"]; got != 200 {
		t.Errorf("p99 = %v, want 200", got)
	}
}

// TestSavedHeader: a saved run gives back the date, command, machine and
// versions it was saved with (header() and savedHeader() round-trip), its
// benchmark lines parse as if the header were not there, and output
// without the header, or with a header line after other output, gives
// empty fields.
func TestSavedHeader(t *testing.T) {
	want := saved{date: "2026-11-29 15:11 UTC", command: "go test -bench . ./test/",
		machine:  "Intel(R) Xeon(R) Processor (`nproc` 2), 23.5 GiB memory, linux/amd64",
		versions: [][2]string{{"Go", "go1.26.8"}, {"etcd server (embedded) / client", "v3.7.3 / v3.7.3"}}}
	raw := want.header() +
		"BenchmarkZKHandoff/impl=tenure/contenders=10-2         	     300	    700000 ns/op	         0.60 p50-ms\n"
	if got := savedHeader([]byte(raw)); !reflect.DeepEqual(got, want) {
		t.Errorf("savedHeader = %+v, want %+v", got, want)
	}
	rs, err := parse(strings.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if r := rs.lookup("BenchmarkZKHandoff", "tenure", 10); r == nil || r.metrics["p50-ms"] != 0.60 {
		t.Errorf("the benchmark line under the header did not parse: %+v", r)
	}
	if got := savedHeader([]byte("goos: linux\n" + dateHeader + "x\n" + machineHeader + "y\n")); !reflect.DeepEqual(got, saved{}) {
		t.Errorf("a header after other output was read: %+v", got)
	}
	if got := versionTable(want.versions); !strings.Contains(got, "| etcd server (embedded) / client | v3.7.3 / v3.7.3 |\n") {
		t.Errorf("versionTable lost a row:\n%s", got)
	}
}
