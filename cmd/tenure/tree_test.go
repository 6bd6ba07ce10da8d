package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/alarmpipe"
)

// running reports whether pid is a process that has not exited (a zombie
// has: it only waits to be reaped).
func running(pid int) bool {
	p, ok := readProcStat(pid)
	return ok && !p.dead
}

// TestRunning_AZombieIsNotRunning: running, which mustDie polls, tells a
// killed process that nobody has reaped yet from a live one, where
// kill(pid, 0) does not.
func TestRunning_AZombieIsNotRunning(t *testing.T) {
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	if !running(pid) {
		t.Fatal("a sleeping process is not running")
	}
	if err := c.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Not reaped (no Wait yet): a zombie once the kill has landed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, ok := readProcStat(pid)
		if !ok {
			t.Fatal("the killed child left /proc before it was reaped")
		}
		if p.dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed child is not a zombie 5 s later")
		}
		time.Sleep(time.Millisecond)
	}
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("kill(pid, 0) fails on the zombie: the test shows nothing")
	}
	if running(pid) {
		t.Error("running(zombie) = true")
	}
	_ = c.Wait()
	if running(pid) {
		t.Error("running(reaped) = true")
	}
}

// leavesTheGroup is a shell command line that runs script under GNU
// timeout, which moves itself, and so script, to a process group of its
// own: a signal to CMD's group misses both. Its output goes nowhere: a
// survivor holding tenure's stderr pipe would hang the test's wait for
// tenure instead of failing it.
func leavesTheGroup(script string) string {
	return `timeout 60 sh -c '` + script + `' </dev/null >/dev/null 2>&1`
}

// TestExec_CutOffStopsWhatLeftTheGroup: a cut-off holder's CMD started a
// process that left CMD's process group (under timeout) and ignores
// SIGTERM. It is SIGKILLed by the same deadline as CMD, before the next
// holder starts. Before, tenure signalled CMD's group alone: the process
// stamped on after the successor had started.
func TestExec_CutOffStopsWhatLeftTheGroup(t *testing.T) {
	cutOff(t, env{"etcd", endpoint}, "300ms", func(alive, pidFile string) string {
		return `echo $$ > ` + pidFile + `; ` + leavesTheGroup(`trap "" TERM; while :; do date +%s%N > `+alive+`.tmp; mv `+alive+`.tmp `+alive+`; sleep 0.01; done`)
	})
}

// TestExec_KilledTenureKillsWhatLeftTheGroup: when tenure is SIGKILLed, the
// guard kills CMD's session, including what left CMD's process group.
// Before, it killed the group alone. The child clears its environment
// (env -i), so that the guard can find it by its session alone, not by
// the run's variables.
func TestExec_KilledTenureKillsWhatLeftTheGroup(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	a := startArmed(t, dir, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "2s", "--",
		"sh", "-c", leavesTheGroup(`echo $$ > `+path(dir, "child-pid")+`; exec env -i sleep 60`))...)
	child := pidIn(t, path(dir, "child-pid"))
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	mustDie(t, child, 3*time.Second, "the command's child outside its process group")
}

// TestExec_KilledBeforeTheGuardKnowsTheSessionLeavesNoOrphans: tenure is
// SIGKILLed after CMD has started, and CMD a child, but before tenure
// has told its guard CMD's session (held there). The guard finds the child
// by the variables of the run in its environment. Before, it knew nothing
// to kill then, and the child ran on without the lock.
func TestExec_KilledBeforeTheGuardKnowsTheSessionLeavesNoOrphans(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	cmd := tenureCmd(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "2s", "--",
		"sh", "-c", `sleep 60 & echo $! > `+path(dir, "child-pid")+`; wait`)...)
	cmd.Env = append(cmd.Env, "TENURE_TEST_HOLD_BEFORE_WATCH="+dir)
	a := startCmd(t, cmd)
	waitFile(t, path(dir, "watch-held"), 15*time.Second)
	child := pidIn(t, path(dir, "child-pid"))
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	mustDie(t, child, 3*time.Second, "the command's child")
}

// TestExec_KilledTenureKillsWhatLeftTheSession: when tenure is SIGKILLed,
// its guard also kills a process of CMD's that made a session of its own
// (setsid), found by the run's variables in its environment, and spares
// a process whose variables name another term of the same key. Before, it
// killed CMD's session alone, and the setsid child ran on.
func TestExec_KilledTenureKillsWhatLeftTheSession(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	script := `env | grep -E '^TENURE_(TERM|KEY|IDENTITY|BACKEND|ENDPOINTS)=' > ` + path(dir, "env") + `; ` +
		`setsid sh -c 'echo $$ > ` + path(dir, "child-pid") + `; exec sleep 60' </dev/null >/dev/null 2>&1 & wait`
	a := startArmed(t, dir, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "2s", "--", "sh", "-c", script)...)
	child := pidIn(t, path(dir, "child-pid"))
	defer syscall.Kill(child, syscall.SIGKILL)
	if p, ok := readProcStat(child); !ok || p.sid != child {
		t.Fatalf("the child is not in a session of its own (%+v): the test shows nothing", p)
	}
	// A bystander with every variable of the run but the term: the next
	// holder's command, say. The guard must leave it alone.
	bystander := exec.Command("sleep", "60")
	for _, kv := range strings.Split(strings.TrimSpace(waitFile(t, path(dir, "env"), 5*time.Second)), "\n") {
		if name, val, _ := strings.Cut(kv, "="); name == "TENURE_TERM" {
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil {
				t.Fatalf("TENURE_TERM=%q", val)
			}
			kv = "TENURE_TERM=" + strconv.FormatUint(n+1, 10)
		}
		bystander.Env = append(bystander.Env, kv)
	}
	if len(bystander.Env) != 5 {
		t.Fatalf("the command saw %d TENURE_ variables (%q), want 5", len(bystander.Env), bystander.Env)
	}
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = bystander.Process.Kill(); _ = bystander.Wait() }()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	mustDie(t, child, 3*time.Second, "the command's child in a session of its own")
	<-a.done
	time.Sleep(200 * time.Millisecond) // the guard's last rounds
	if !running(bystander.Process.Pid) {
		t.Fatal("the guard killed a process of another term of the key")
	}
}

// TestExec_SIGTERMStopsWhatLeftTheGroupBeforeRelease: on SIGTERM, what
// CMD started outside its process group gets SIGTERM too, and, ignoring
// it, SIGKILL --grace later, before KEY is released and tenure exits.
// Before, it ran on, and the next holder started beside it.
func TestExec_SIGTERMStopsWhatLeftTheGroupBeforeRelease(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	alive := path(dir, "alive") // the child stamps it every 10 ms
	a := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--grace", "500ms", "--",
		"sh", "-c", leavesTheGroup(`trap "" TERM; echo $$ > `+path(dir, "child-pid")+`; while :; do date +%s%N > `+alive+`.tmp; mv `+alive+`.tmp `+alive+`; sleep 0.01; done`))...)
	child := pidIn(t, path(dir, "child-pid"))
	b := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--", "sh", "-c", `date +%s%N > `+path(dir, "b-start"))...)
	v.waitQueued(t, key, 2)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := a.wait(t, 5*time.Second)
	childRan := running(child)
	if childRan {
		_ = syscall.Kill(child, syscall.SIGKILL)
	}
	if childRan {
		t.Fatalf("tenure exited %d with the command's child (outside its group, ignoring SIGTERM) still running; stderr: %s", code, a.stderr)
	}
	if code != 128+int(syscall.SIGTERM) {
		t.Errorf("tenure exited %d, want %d (its command ended by SIGTERM); stderr: %s", code, 128+int(syscall.SIGTERM), a.stderr)
	}
	bStart := nanos(t, waitFile(t, path(dir, "b-start"), 5*time.Second))
	if lastAlive := nanos(t, waitFile(t, alive, time.Second)); !lastAlive.Before(bStart) {
		t.Fatalf("the command's child was alive %v after the successor started: KEY was released before it was stopped", lastAlive.Sub(bStart))
	}
	if code := b.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("successor exited %d; stderr: %s", code, b.stderr)
	}
}

// TestExec_PausedPastTheDeadlineKillsAtOnce: tenure and CMD (which ignores
// SIGTERM) are stopped past the lease's expiry; the next holder starts
// meanwhile. When they run again, CMD must be SIGKILLed at once, not given
// --grace counted from the moment tenure noticed: its time ran out while
// it was stopped. Before, it ran on for the whole --grace (1 s here)
// beside the successor.
func TestExec_PausedPastTheDeadlineKillsAtOnce(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	alive := path(dir, "alive")
	a := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "2s", "--grace", "1s", "--",
		"sh", "-c", `trap '' TERM; echo $$ > `+path(dir, "a-pid")+`; while :; do date +%s%N > `+alive+`.tmp; mv `+alive+`.tmp `+alive+`; sleep 0.01; done`)...)
	cmdPid := pidIn(t, path(dir, "a-pid"))
	b := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "2s", "--", "sh", "-c", `date +%s%N > `+path(dir, "b-start"))...)
	v.waitQueued(t, key, 2)
	stopped := time.Now()
	_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGSTOP)
	_ = syscall.Kill(-cmdPid, syscall.SIGSTOP)
	t.Cleanup(func() { _ = syscall.Kill(-cmdPid, syscall.SIGKILL) })
	bStart := nanos(t, waitFile(t, path(dir, "b-start"), 10*time.Second))
	time.Sleep(200 * time.Millisecond)
	thawed := time.Now()
	_ = syscall.Kill(a.cmd.Process.Pid, syscall.SIGCONT)
	_ = syscall.Kill(-cmdPid, syscall.SIGCONT)
	if code := a.wait(t, 5*time.Second); code != exitLostLead {
		t.Fatalf("holder exited %d, want %d; stderr: %s", code, exitLostLead, a.stderr)
	}
	time.Sleep(100 * time.Millisecond)
	lastAlive := nanos(t, waitFile(t, alive, time.Second))
	t.Logf("stopped; successor started %v later; thawed %v after that; the command's last sign of life %v after the thaw",
		bStart.Sub(stopped), thawed.Sub(bStart), lastAlive.Sub(thawed))
	if after := lastAlive.Sub(thawed); after > 500*time.Millisecond {
		t.Errorf("the command ran %v after the thaw, beside its successor (--grace 1s was spent while stopped)", after)
	}
	if code := b.wait(t, 5*time.Second); code != 0 {
		t.Fatalf("successor exited %d; stderr: %s", code, b.stderr)
	}
}

// TestExec_SignalledWithStderrBlockedStillKillsByTheDeadline: a holder
// whose stderr blocks is sent SIGTERM (CMD ignores it), then cut off. Its
// line about the SIGTERM cannot be written; that must not stop it from
// acting on the loss. Before, it blocked in that write, and CMD ran on
// after the successor started, until the reader came back.
func TestExec_SignalledWithStderrBlockedStillKillsByTheDeadline(t *testing.T) {
	cutOffWithStderrBlocked(t, true)
}

// TestExec_SecondSignalKillsLeftoversAtOnce: CMD exits on SIGTERM but
// leaves a child that ignores it; --grace is 10 s. A second signal while
// tenure waits for that child SIGKILLs it at once. Before, signals went
// unread there, and tenure waited out the whole --grace.
func TestExec_SecondSignalKillsLeftoversAtOnce(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	a := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "30s", "--grace", "10s", "--",
		"sh", "-c", `trap 'exit 0' TERM; sh -c 'trap "" TERM; echo $$ > `+path(dir, "child-pid")+`; exec sleep 60' </dev/null >/dev/null 2>&1 & while :; do sleep 0.01; done`)...)
	child := pidIn(t, path(dir, "child-pid"))
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !running(child) {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		t.Fatalf("the leftover child died of the first SIGTERM: the test shows nothing (stat %q; tenure's stderr: %s)", st, a.stderr)
	}
	sent := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := a.wait(t, 15*time.Second)
	took := time.Since(sent)
	t.Logf("second SIGTERM while a leftover child runs (--ttl 30s --grace 10s): tenure exited %d %v later", code, took)
	if took > 3*time.Second {
		t.Errorf("tenure took %v after the second signal, want it to SIGKILL the leftover at once", took)
	}
	if code != 0 {
		t.Errorf("tenure exited %d, want CMD's 0; stderr: %s", code, a.stderr)
	}
	if running(child) {
		t.Error("the leftover child still runs")
	}
}

// TestExec_SignalDuringAStuckReleaseEndsTenure: CMD has exited and the
// release hangs (the backend went silent). A first signal then is noted
// (a release usually takes milliseconds: one that came just as CMD exited
// must not give it up); a second ends tenure at once: KEY expires with
// the session, as when tenure is killed. Before, signals went unread
// until the release gave up, seconds later.
func TestExec_SignalDuringAStuckReleaseEndsTenure(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	proxy := newProxy(t, v.endpoint)
	a := start(t, append(append([]string{"exec"}, v.flags(proxy.Addr())...), "--key", key, "--ttl", "10s", "--",
		"sh", "-c", `touch `+path(dir, "cut-now")+`; while [ ! -e `+path(dir, "cut")+` ]; do sleep 0.01; done; exit 3`)...)
	waitFile0(t, path(dir, "cut-now"), 10*time.Second)
	proxy.Blackhole()
	if err := os.WriteFile(path(dir, "cut"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // CMD has exited; the release hangs
	select {
	case <-a.done:
		t.Fatalf("tenure exited %d before the signal: the release did not hang, the test shows nothing; stderr: %s", a.code, a.stderr)
	default:
	}
	code, took := signalTwice(t, a, 15*time.Second)
	t.Logf("second SIGTERM during a hung release: tenure exited %d %v later; stderr: %s", code, took, a.stderr)
	if took > 2*time.Second {
		t.Errorf("tenure took %v after the signal to exit", took)
	}
	if code != 3 {
		t.Errorf("tenure exited %d, want CMD's 3", code)
	}
	if !strings.Contains(a.stderr.String(), "while releasing") {
		t.Errorf("stderr %q does not say the release was not waited for", a.stderr)
	}
}

// waitFile0 waits until path exists, empty or not.
func waitFile0(t *testing.T, path string, d time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not created within %v", path, d)
		}
	}
}

// TestExec_ChildrenTenureHadBeforeAreNotCMDs: a process the shell forked
// before it exec'd tenure (a log reader, a sidecar) is tenure's child, but
// not CMD's: tenure must neither signal it nor wait for it; nor what such
// a child leaves behind while CMD runs, which the kernel also gives to
// tenure. Before, both counted as leftovers of CMD: SIGTERM, then SIGKILL
// --grace later (5 s here), on every run.
func TestExec_ChildrenTenureHadBeforeAreNotCMDs(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	args := strings.Join(append(append([]string{os.Args[0], "exec"}, v.flags("")...), "--key", key, "--ttl", "10s", "--grace", "5s", "--", "sleep", "1"), " ")
	sh := exec.Command("sh", "-c", `sleep 30 </dev/null >/dev/null 2>&1 & echo $! > `+path(dir, "pid")+`; `+
		`(sleep 0.5; sleep 30 </dev/null >/dev/null 2>&1 & echo $! > `+path(dir, "orphan-pid")+`) & exec `+args)
	sh.Env = append(os.Environ(), "TENURE_TEST_AS_CLI=1")
	var stderr strings.Builder
	sh.Stderr = &stderr
	begun := time.Now()
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	code := exitWithin(t, sh, 15*time.Second, "tenure exec")
	took := time.Since(begun)
	side, orphan := pidIn(t, path(dir, "pid")), pidIn(t, path(dir, "orphan-pid"))
	defer syscall.Kill(side, syscall.SIGKILL)
	defer syscall.Kill(orphan, syscall.SIGKILL)
	t.Logf("tenure exec -- sleep 1, with a child from before that leaves an orphan: exit %d after %v", code, took)
	if code != 0 {
		t.Errorf("exit %d, want 0; stderr: %s", code, stderr.String())
	}
	if !running(side) {
		t.Error("tenure killed a process its shell had started before it (not CMD's)")
	}
	if !running(orphan) {
		t.Error("tenure killed what a child from before left behind (not CMD's)")
	}
	if took > 4*time.Second {
		t.Errorf("tenure took %v: it waited for a process that is not CMD's", took)
	}
}

// TestExec_NestedExecGetsOneSIGTERM: a tenure exec whose CMD is another
// tenure exec, signalled: the inner one passes SIGTERM on to its CMD,
// which must get it once. Before, the outer one also signalled the inner
// CMD directly (outside the outer's group), so it got SIGTERM twice, and a
// third level would take the second for "kill now".
func TestExec_NestedExecGetsOneSIGTERM(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	count := path(dir, "terms")
	inner := append(append([]string{os.Args[0], "exec"}, v.flags("")...), "--key", key+"-inner", "--ttl", "10s", "--",
		"sh", "-c", `trap 'echo term >> `+count+`; sleep 0.5; exit 0' TERM; echo $$ > `+path(dir, "pid")+`; while :; do sleep 0.01; done`)
	a := start(t, append(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "10s", "--"), inner...)...)
	pidIn(t, path(dir, "pid"))
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := a.wait(t, 10*time.Second)
	b, _ := os.ReadFile(count)
	n := strings.Count(string(b), "term")
	t.Logf("SIGTERM to the outer tenure exec: the inner command trapped SIGTERM %d time(s); exit %d", n, code)
	if n != 1 {
		t.Errorf("the inner command got SIGTERM %d times, want once", n)
	}
	if code != 0 {
		t.Errorf("exit %d, want the inner command's 0; stderr: %s", code, a.stderr)
	}
}

// TestExec_KilledNestedExecKillsWhatLeftTheInnerGroup: the outer tenure of
// two nested ones is SIGKILLed. Its guard kills its CMD (the inner tenure)
// and that session; the inner guard, in a session of its own, must live
// to kill the inner CMD's session, including what left the inner CMD's
// group. Before, both guards shared a session, and the outer one could
// kill the inner one first. The inner guard's environment must not hold
// the outer run's variables either, or the outer guard finds it by them.
func TestExec_KilledNestedExecKillsWhatLeftTheInnerGroup(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	inner := append(append([]string{os.Args[0], "exec"}, v.flags("")...), "--key", key+"-inner", "--ttl", "10s", "--",
		"sh", "-c", leavesTheGroup(`echo $$ > `+path(dir, "child-pid")+`; exec sleep 60`))
	a := start(t, append(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "10s", "--"), inner...)...)
	child := pidIn(t, path(dir, "child-pid"))
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	mustDie(t, child, 3*time.Second, "the inner command's child outside its process group")
}

// TestExec_SetsidChildOfCMDIsStopped: a process CMD starts in a session
// of its own (setsid, Python's start_new_session) is CMD's: tenure stops
// it before it releases KEY, when CMD exits and on SIGTERM. At ae1dd93 it
// escaped: once its parent had exited it was adopted outside CMD's
// session, and left alone.
func TestExec_SetsidChildOfCMDIsStopped(t *testing.T) {
	v := env{"etcd", endpoint}
	for _, how := range []string{"CMD exits", "SIGTERM"} {
		t.Run(how, func(t *testing.T) {
			key, dir := v.key(t), dirT(t)
			script := `setsid sh -c 'trap "" TERM; echo $$ > ` + path(dir, "pid") + `; exec sleep 60' </dev/null >/dev/null 2>&1 &`
			if how == "SIGTERM" {
				script += ` while :; do sleep 0.01; done`
			} else { // CMD exits once the child has written its pid
				script += ` while [ ! -s ` + path(dir, "pid") + ` ]; do sleep 0.01; done`
			}
			a := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--grace", "500ms", "--", "sh", "-c", script)...)
			child := pidIn(t, path(dir, "pid"))
			defer syscall.Kill(child, syscall.SIGKILL)
			if p, ok := readProcStat(child); !ok || p.sid != child {
				t.Fatalf("the child is not in a session of its own (%+v): the test shows nothing", p)
			}
			if how == "SIGTERM" {
				if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			code := a.wait(t, 10*time.Second)
			if running(child) {
				t.Fatalf("tenure exited %d with CMD's setsid child still running; stderr: %s", code, a.stderr)
			}
		})
	}
}

// TestGuard_LinesWrittenBeforeTheInstantCount: a guard that reads its
// pipe late (slow to start, starved) finds a kill instant already passed
// and, behind it, "done": it must obey the line, written before the
// instant passed, and kill nothing. A marked process with no line at all
// behind a passed instant is killed.
func TestGuard_LinesWrittenBeforeTheInstantCount(t *testing.T) {
	mark := "TENURE_TEST_GUARD_MARK=" + strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, tc := range []struct {
		name  string
		lines string
		kill  bool
	}{
		{"done after a passed instant", "%d\nkill-at %d\ndone\n", false},
		{"a later instant after a passed one", "%d\nkill-at %d\nkill-at 9223372036854775807\n", false},
		{"a passed instant alone", "%d\nkill-at %d\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			victim := exec.Command("sleep", "60")
			victim.Env = append(os.Environ(), mark)
			victim.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
			if err := victim.Start(); err != nil {
				t.Fatal(err)
			}
			waited := make(chan struct{})
			go func() { _ = victim.Wait(); close(waited) }()
			defer func() { _ = victim.Process.Kill(); <-waited }()
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			// Every line is in the pipe before the guard starts.
			fmt.Fprintf(w, tc.lines, victim.Process.Pid, alarmpipe.Now()-int64(time.Second))
			g := tenureCmd(guardCommand, mark)
			g.Stdin = r
			if err := g.Start(); err != nil {
				t.Fatal(err)
			}
			r.Close()
			time.Sleep(500 * time.Millisecond)
			killed := false
			select {
			case <-waited:
				killed = true
			default:
			}
			w.Close() // the guard exits (after "done", or at EOF, killing)
			_ = g.Wait()
			if killed != tc.kill {
				t.Fatalf("the marked process killed: %v, want %v", killed, tc.kill)
			}
		})
	}
}
