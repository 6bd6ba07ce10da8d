package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
)

// TestLeader_WatchEndsOnASignalWhileItsReaderStalls: `tenure leader
// --watch | slow-reader`, the reader stalled with the pipe full: a SIGTERM
// (or two) did not end tenure, which waited in a write inside the watch's
// callback, and the watch could not end; only SIGKILL did (under systemd,
// the whole stop timeout). The write now waits in a goroutine of its own
// and the signal ends the watch (exit 0, as a signal ends --watch).
func TestLeader_WatchEndsOnASignalWhileItsReaderStalls(t *testing.T) {
	key := testKey(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close() // never read: the reader stalls
	// The smallest pipe (a page): a few changes fill it.
	const pipeSize = 4096
	if _, err := unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, pipeSize); err != nil {
		t.Fatal(err)
	}
	p := tenureCmd("leader", "--backend", "etcd", "--endpoints", endpoint, "--key", key, "--watch", "--json")
	p.Stdout = w
	var stderr strings.Builder
	p.Stderr = &stderr
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	done := make(chan int, 1)
	exited := make(chan struct{})
	go func() {
		p.Wait()
		done <- p.ProcessState.ExitCode()
		close(exited)
	}()
	defer func() {
		p.Process.Kill() // if it still runs
		<-exited
	}()

	// Changes of about 400 bytes (holder) and 100 (vacant) until the pipe
	// holds more than a holder's line could still join: tenure then waits
	// in its next write.
	e, err := election.New(etcdelect.New(newClient(t, endpoint)), election.Config{Key: key, Identity: strings.Repeat("x", 350), TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full := func() bool {
		n, err := unix.IoctlGetInt(int(r.Fd()), unix.TIOCINQ)
		return err == nil && n > pipeSize-400
	}
	for i := 0; !full(); i++ {
		if i == 200 {
			t.Fatalf("the pipe is not full after %d changes", i)
		}
		if _, err := e.Campaign(ctx); err != nil {
			t.Fatal(err)
		}
		if err := e.Resign(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // for the watch to see each change
	}
	// One more change: the write of it waits, the pipe full.
	if _, err := e.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	select {
	case code := <-done:
		t.Fatalf("tenure leader --watch exited %d before the signal; stderr: %s", code, stderr.String())
	default:
	}
	signaled := time.Now()
	if err := p.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after SIGTERM, want 0; stderr: %s", code, stderr.String())
		}
		t.Logf("exited %v after SIGTERM with its reader stalled", time.Since(signaled).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		t.Fatalf("tenure leader --watch still runs 3 s after SIGTERM, its reader stalled; stderr: %s", stderr.String())
	}
}
