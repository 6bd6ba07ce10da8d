package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemo_RunsAndExitsWithin60s: `tenure demo` needs no flags, shows the
// three failovers with growing terms and no overlap, and exits 0 in time.
func TestDemo_RunsAndExitsWithin60s(t *testing.T) {
	p := tenureCmd("demo")
	var out strings.Builder
	p.Stdout = &out
	p.Stderr = &out
	start := time.Now()
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo: %v\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		_ = p.Process.Kill()
		<-done
		t.Fatalf("demo still running after 60 s:\n%s", out.String())
	}
	t.Logf("demo took %v", time.Since(start).Round(time.Millisecond))
	for _, want := range []string{"embedded etcd ready", "resign ", "kill ", "cut off ", "no overlap", "terms only grew"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	// "terms only grew" is printed whatever happened: check the summary
	// table's terms, each failover's from its predecessor's.
	rows := regexp.MustCompile(`(?m)^(resign|kill|cut off)\s+\S+\s+\S+\s+(\d+) → (\d+)\s`).FindAllStringSubmatch(out.String(), -1)
	if len(rows) != 3 || rows[0][1] != "resign" || rows[1][1] != "kill" || rows[2][1] != "cut off" {
		t.Fatalf("summary rows %q, want resign, kill and cut off:\n%s", rows, out.String())
	}
	var prev uint64
	for i, r := range rows {
		from, _ := strconv.ParseUint(r[2], 10, 64)
		to, _ := strconv.ParseUint(r[3], 10, 64)
		if from == 0 || to <= from || (i > 0 && from != prev) {
			t.Errorf("%s: terms %d → %d after %d: terms must grow, each failover from the last term", r[1], from, to, prev)
		}
		prev = to
	}
}
