package main

import (
	"bufio"
	"os"
	"os/exec"
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

// TestDemo_InterruptCleansUp: Ctrl-C during the demo stops it through its
// own clean-up: exit 130, and its data directory is gone.
func TestDemo_InterruptCleansUp(t *testing.T) {
	needSignal(t, os.Interrupt)
	p, lines, dir, stderr := demoAtTheKill(t)
	if err := p.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	for range lines { // drain until the demo closes its stdout
	}
	if code := exitWithin(t, p, 15*time.Second, "the interrupted demo"); code != 130 {
		t.Errorf("the interrupted demo exited %d, want 130; stderr: %s", code, stderr.String())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		_ = os.RemoveAll(dir)
		t.Errorf("the interrupted demo left %s behind (%v)", dir, err)
	}
}

// TestDemo_SecondInterruptExitsAtOnce: a second Ctrl-C while the first
// one's clean-up runs exits at once (leaving the clean-up undone).
func TestDemo_SecondInterruptExitsAtOnce(t *testing.T) {
	needSignal(t, os.Interrupt)
	p, lines, dir, stderr := demoAtTheKill(t)
	defer os.RemoveAll(dir)
	if err := p.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	second := time.Now()
	if err := p.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines {
		}
	}()
	code := exitWithin(t, p, 15*time.Second, "the twice-interrupted demo")
	took := time.Since(second)
	if code != 130 || took > 2*time.Second {
		t.Fatalf("the demo exited %d, %v after a second SIGINT; want 130 within 2 s; stderr: %s", code, took, stderr.String())
	}
}

// demoAtTheKill starts tenure demo and returns once it has killed its
// second leader (its clean-up then takes a while): the process, its
// remaining stdout lines, its data directory and its stderr.
func demoAtTheKill(t *testing.T) (*exec.Cmd, <-chan string, string, *strings.Builder) {
	t.Helper()
	p := tenureCmd("demo")
	outPipe, err := p.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	p.Stderr = stderr
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outPipe)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	dataDir := regexp.MustCompile(`\(data in (\S+)\)`)
	var dir string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the demo ended before the kill; stderr: %s", stderr.String())
			}
			if m := dataDir.FindStringSubmatch(l); m != nil {
				dir = m[1]
			}
			if dir != "" && strings.Contains(l, "is killed") {
				return p, lines, dir, stderr
			}
		case <-timeout:
			_ = p.Process.Kill()
			t.Fatal("the demo did not reach the kill within 30 s")
		}
	}
}
