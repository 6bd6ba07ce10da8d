package main

import (
	"strings"
	"testing"
)

// TestZKSplitTable: the wire split's figures land in their columns (the
// median over rounds), a driver has the server's CPU time only, and a
// skipped implementation has no row.
func TestZKSplitTable(t *testing.T) {
	out := `BenchmarkZKHandoff/impl=tenure/contenders=10/round=1-2 	300	700000 ns/op	3.5 release-us	240 commit-us	6.0 wake-us	220 read-us	11 elect-us	21 client-us	15 requeue-us	1 split	560 zk-cpu-us/handoff	280 go-cpu-us/handoff
BenchmarkZKHandoff/impl=tenure/contenders=10/round=2-2 	300	700000 ns/op	4.5 release-us	260 commit-us	8.0 wake-us	200 read-us	13 elect-us	25 client-us	17 requeue-us	0.98 split	600 zk-cpu-us/handoff	300 go-cpu-us/handoff
BenchmarkZKHandoff/impl=gozk-lock/contenders=10/round=1-2 	300	700000 ns/op	2.0 release-us	230 commit-us	5.5 wake-us	215 read-us	7.0 elect-us	16 client-us	10 requeue-us	1 split	550 zk-cpu-us/handoff	240 go-cpu-us/handoff
BenchmarkZKHandoff/impl=kazoo/contenders=10/round=1-2 	300	700000 ns/op	1.5 p50-ms	900 zk-cpu-us/handoff
--- SKIP: BenchmarkZKHandoff/impl=curator/contenders=10/round=1-2
    zk_bench_test.go:200: curator: no java on PATH
`
	rs, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	table := (&report{rs: rs}).zkSplitTable()
	for _, row := range []string{
		"| 10 | **tenure** | 4.00 | 250 | 7.00 | 210 | 12.0 | 23.0 | 16.0 | 0.990 | 580 | 290 |",
		"| 10 | go-zookeeper Lock | 2.00 | 230 | 5.50 | 215 | 7.00 | 16.0 | 10.0 | 1.00 | 550 | 240 |",
		"| 10 | kazoo Lock | – | – | – | – | – | – | – | – | 900 | – |",
	} {
		if !strings.Contains(table, row+"\n") {
			t.Errorf("no row %q in\n%s", row, table)
		}
	}
	if strings.Contains(table, "Curator") {
		t.Errorf("a row for the skipped Curator run:\n%s", table)
	}
}
