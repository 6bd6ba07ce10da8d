package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWatchdog_StoppedManagerCannotKeepItsPrimaryOpen: the primary's
// manager alone is stopped (SIGSTOP), so it cannot fence at its lease
// deadline, while its PostgreSQL, in a process group of its own, runs on
// and a client connected to it keeps committing. The manager's watchdog
// must kill that PostgreSQL before the other member is elected: no commit
// may be acknowledged by the old primary after the new one's election.
// Before the watchdog, the old primary acknowledged commits until its
// manager was resumed (README, Limits).
func TestWatchdog_StoppedManagerCannotKeepItsPrimaryOpen(t *testing.T) {
	c, _ := testCluster(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	old, standby := twoMembers(ctx, t, c)

	// A client of the old primary's own PostgreSQL, not routed through
	// /primary: it commits every few milliseconds for as long as it can.
	conn, err := c.connect(ctx, old.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	type result struct {
		last  time.Time // the last commit acknowledged
		count int
		err   error
	}
	wctx, stopWriting := context.WithCancel(ctx)
	defer stopWriting()
	written := make(chan result, 1)
	go func() {
		var r result
		for i := 0; wctx.Err() == nil; i++ {
			cctx, ccancel := context.WithTimeout(wctx, 2*time.Second)
			_, err := Write(cctx, conn, old.Term, fmt.Sprintf("frozen-manager-%d", i))
			ccancel()
			if err != nil {
				r.err = err
				break
			}
			r.last, r.count = time.Now(), r.count+1
			time.Sleep(5 * time.Millisecond)
		}
		written <- r
	}()
	time.Sleep(200 * time.Millisecond) // a few commits before the stop

	c.mu.Lock()
	mgr := c.procs[old.Name].cmd.Process
	c.mu.Unlock()
	stopped := time.Now()
	if err := mgr.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = mgr.Signal(syscall.SIGCONT)
		}
	}
	defer resume()

	next, err := c.waitPrimary(ctx, 30*time.Second, old.Name)
	if err != nil {
		t.Fatal(err)
	}
	if next.Name != standby {
		t.Fatalf("%s became primary, want the standby %s", next.Name, standby)
	}
	elected, ok := history{c.eventLog()}.find("elected", next.Name, next.Term)
	if !ok {
		t.Fatalf("no elected event of %s for term %d", next.Name, next.Term)
	}
	time.Sleep(time.Second) // an old primary still open would commit on
	stopWriting()
	r := <-written
	resume()
	t.Logf("manager of %s stopped; its PostgreSQL's last acknowledged commit %v after the stop (%d commits), %s elected %v after the stop (%v later); the client's error: %v",
		old.Name, r.last.Sub(stopped), r.count, next.Name, elected.Sub(stopped), elected.Sub(r.last), r.err)
	if r.count == 0 {
		t.Fatal("no commit before the stop: the test shows nothing")
	}
	if !r.last.Before(elected) {
		t.Fatalf("the old primary %s acknowledged a commit %v after %s was elected", old.Name, r.last.Sub(elected), next.Name)
	}
	if r.err == nil {
		t.Fatalf("the old primary %s still took commits %v after %s was elected", old.Name, time.Since(elected), next.Name)
	}
}

// fakePostmaster starts a shell script whose command line names postgres
// and which starts a child in a session of its own, as the postmaster's
// backends are; it returns both pids.
func fakePostmaster(t *testing.T) (pm, kid int) {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "postgres-fake.sh")
	kidFile := filepath.Join(dir, "kid")
	if err := os.WriteFile(script, []byte("setsid sleep 60 </dev/null >/dev/null 2>&1 &\necho $! > "+kidFile+"\nwait\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(kidFile)
		if n, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && n > 0 {
			kid = n
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fake postmaster's child did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(kid, syscall.SIGKILL) })
	return cmd.Process.Pid, kid
}

// running reports whether pid runs (a zombie does not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

// TestWatchdog_KillsThePostmasterAndItsBackendsAtTheInstant runs the
// watchdog process on fake postmasters: armed, it kills the postmaster and
// its child in a session of its own (which a signal to the postmaster's
// group misses) at the instant and not before; disarmed, nothing; armed
// when the manager's end of the pipe closes (the manager died), at once.
func TestWatchdog_KillsThePostmasterAndItsBackendsAtTheInstant(t *testing.T) {
	// The watchdog is this test binary (see TestMain).
	dogWait := func(t *testing.T) *watchdog {
		d, err := startWatchdog()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(d.close)
		return d
	}
	dieWithin := func(t *testing.T, pid int, d time.Duration, what string) time.Duration {
		t.Helper()
		begun := time.Now()
		for running(pid) {
			if time.Since(begun) > d {
				t.Fatalf("%s still runs %v later", what, d)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(begun)
	}
	t.Run("armed", func(t *testing.T) {
		d := dogWait(t)
		pm, kid := fakePostmaster(t)
		at := time.Now().Add(400 * time.Millisecond)
		if err := d.arm(pm, at); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		if !running(pm) || !running(kid) {
			t.Fatalf("killed before the instant (postmaster running %v, child %v)", running(pm), running(kid))
		}
		dieWithin(t, pm, 5*time.Second, "the postmaster")
		dieWithin(t, kid, time.Second, "the postmaster's child in a session of its own")
		t.Logf("killed %v after the instant", time.Since(at))
	})
	t.Run("disarmed", func(t *testing.T) {
		d := dogWait(t)
		pm, kid := fakePostmaster(t)
		if err := d.arm(pm, time.Now().Add(200*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if err := d.disarm(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond)
		if !running(pm) || !running(kid) {
			t.Fatalf("killed though disarmed (postmaster running %v, child %v)", running(pm), running(kid))
		}
	})
	t.Run("manager died", func(t *testing.T) {
		d := dogWait(t)
		pm, kid := fakePostmaster(t)
		if err := d.arm(pm, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		d.w.Close() // the pipe closes without "exit", as when the manager dies
		d.err = os.ErrClosed
		d.mu.Unlock()
		dieWithin(t, pm, 5*time.Second, "the postmaster of a dead manager")
		dieWithin(t, kid, time.Second, "the child of the postmaster of a dead manager")
	})
}
