package main

import (
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
}
