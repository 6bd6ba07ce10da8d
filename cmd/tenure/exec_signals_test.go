package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/election"
)

// TestExec_MissingCommandIsReportedBeforeTheCampaign: a command that
// cannot be found fails at once with 127, without waiting for KEY (held
// here), and --no-wait reports it too instead of exiting 0 because KEY is
// held (a typo on N cron replicas would otherwise never show).
func TestExec_MissingCommandIsReportedBeforeTheCampaign(t *testing.T) {
	v := env{"etcd", endpoint}
	key := v.key(t)
	holdKey(t, v, key)
	for _, mode := range [][]string{{"--no-wait"}, nil} {
		args := append(append([]string{"exec"}, v.flags("")...), "--key", key)
		args = append(append(args, mode...), "--", "/nonexistent/bakup.sh")
		began := time.Now()
		p := start(t, args...)
		code := p.wait(t, 15*time.Second)
		took := time.Since(began)
		if code != exitCannotRun {
			t.Fatalf("exec %v of a missing command, KEY held: exit %d, want %d; stderr: %s", mode, code, exitCannotRun, p.stderr)
		}
		if took > 3*time.Second {
			t.Fatalf("exec %v of a missing command took %v: it waited for KEY", mode, took)
		}
		if !strings.Contains(p.stderr.String(), "cannot run /nonexistent/bakup.sh") {
			t.Fatalf("stderr %q does not name the command", p.stderr)
		}
	}
	// Neither queued: only the holder's entry is there.
	if n := v.queued(t, key); n != 1 {
		t.Fatalf("%d entries under the key, want the holder's 1", n)
	}
}

// TestExec_SignalJustBeforeTheStartDoesNotRunCMD: a SIGTERM that comes
// after the election but before CMD starts (here: while tenure is held
// just before the start) is not left for CMD: CMD is not run, KEY is
// released, and tenure exits 128+15.
func TestExec_SignalJustBeforeTheStartDoesNotRunCMD(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	cmd := tenureCmd(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--ttl", "10s", "--",
		"sh", "-c", `trap "" TERM; echo ran > `+path(dir, "a-ran"))...)
	cmd.Env = append(cmd.Env, "TENURE_TEST_HOLD_BEFORE_START="+dir)
	a := startCmd(t, cmd)
	waitFile(t, path(dir, "held"), 10*time.Second)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // delivered to tenure's channel
	if err := os.WriteFile(path(dir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := a.wait(t, 5*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("tenure signalled before CMD started exited %d, want %d; stderr: %s", code, 128+int(syscall.SIGTERM), a.stderr)
	}
	if _, err := os.Stat(path(dir, "a-ran")); err == nil {
		t.Fatalf("CMD ran although SIGTERM came before it started; stderr: %s", a.stderr)
	}
	if !strings.Contains(a.stderr.String(), "not running") {
		t.Fatalf("stderr %q does not say CMD was not run", a.stderr)
	}
	v.waitQueued(t, key, 0) // released, not left to expire
}

// procState returns the state letter of process pid (T: stopped).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(stat), ')') // after the command's name
	if i < 0 || i+2 >= len(stat) {
		t.Fatalf("cannot parse /proc/%d/stat: %q", pid, stat)
	}
	return stat[i+2]
}

// TestExec_TerminalStopSignalsDoNotStopTenureWhileCMDRuns: Ctrl-Z
// (SIGTSTP), SIGTTOU (a background job writing to its terminal under `stty
// tostop`) and SIGTTIN do not stop tenure while CMD runs: stopped, it could
// neither renew its lease nor stop CMD at its deadline, while CMD, in its
// own session, ran on. tenure runs in a process group of its own whose
// parent (the test) is in another group of the same session: in an
// orphaned group the kernel would drop these signals whatever tenure did.
// A plain sleep started the same way shows that each stops there.
func TestExec_TerminalStopSignalsDoNotStopTenureWhileCMDRuns(t *testing.T) {
	ownGroup := &syscall.SysProcAttr{Setpgid: true}
	for name, sig := range map[string]syscall.Signal{"SIGTSTP": syscall.SIGTSTP, "SIGTTOU": syscall.SIGTTOU, "SIGTTIN": syscall.SIGTTIN} {
		t.Run(name, func(t *testing.T) {
			control := exec.Command("sleep", "5")
			control.SysProcAttr = ownGroup
			if err := control.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = control.Process.Kill(); _ = control.Wait() }()
			_ = control.Process.Signal(sig)
			time.Sleep(200 * time.Millisecond)
			if st := procState(t, control.Process.Pid); st != 'T' {
				t.Skipf("%s did not stop a plain sleep started the same way (state %c): the test could not tell", name, st)
			}
			v := env{"etcd", endpoint}
			key, dir := v.key(t), dirT(t)
			cmd := tenureCmd(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--",
				"sh", "-c", `echo $$ > `+path(dir, "a-pid")+`; sleep 1`)...)
			cmd.SysProcAttr = ownGroup
			a := startCmd(t, cmd)
			pidIn(t, path(dir, "a-pid"))
			if err := a.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if st := procState(t, a.cmd.Process.Pid); st == 'T' {
				_ = a.cmd.Process.Signal(syscall.SIGCONT)
				t.Fatalf("tenure was stopped by %s while its command ran (state %c)", name, st)
			}
			if code := a.wait(t, 10*time.Second); code != 0 {
				t.Fatalf("tenure exited %d; stderr: %s", code, a.stderr)
			}
		})
	}
}

// TestExec_SecondSignalEndsAWaitingTenureWhoseBackendHangs: a waiter cut
// off from its backend, signalled, removes its entry and closes its
// session on a fresh context bounded by the clean-up timeout (the TTL,
// 10 s here) at each step; a second signal ends that wait at once (the
// entry, if still there, expires with the session).
func TestExec_SecondSignalEndsAWaitingTenureWhoseBackendHangs(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	holdKey(t, v, key)
	proxy := newProxy(t, v.endpoint)
	b := start(t, append(append([]string{"exec"}, v.flags(proxy.Addr())...), "--key", key, "--ttl", "10s", "--",
		"touch", path(dir, "b-ran"))...)
	v.waitQueued(t, key, 2)
	proxy.Blackhole()
	code, took := signalTwice(t, b, 30*time.Second)
	t.Logf("exited %d, %v after the second signal (TTL and clean-up timeout 10 s)", code, took)
	if took > 2*time.Second {
		t.Fatalf("tenure took %v to exit after a second signal: it waited for a clean-up its backend could not answer; stderr: %s", took, b.stderr)
	}
	if code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d, want %d; stderr: %s", code, 128+int(syscall.SIGTERM), b.stderr)
	}
	if _, err := os.Stat(path(dir, "b-ran")); err == nil {
		t.Fatal("the command ran")
	}
}

// TestExec_SignalEndsTheCleanUpAfterLeadershipWasLost: a leader cut off
// from its backend stops CMD at its deadline and then closes its session,
// which waits up to the clean-up timeout (the TTL) on a link that does not
// answer; a signal then ends that wait at once. The exit status stays 4.
func TestExec_SignalEndsTheCleanUpAfterLeadershipWasLost(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	proxy := newProxy(t, v.endpoint)
	a := start(t, append(append([]string{"exec"}, v.flags(proxy.Addr())...), "--key", key, "--ttl", "4s", "--grace", "200ms", "--",
		"sh", "-c", `echo $$ > `+path(dir, "a-pid")+`; while :; do sleep 0.05; done`)...)
	pid := pidIn(t, path(dir, "a-pid"))
	proxy.Blackhole()
	mustDie(t, pid, 10*time.Second, "the cut-off leader's command")
	time.Sleep(300 * time.Millisecond) // tenure is in its clean-up now
	select {
	case <-a.done:
		t.Skipf("tenure exited %d before the test could signal its clean-up", a.code)
	default:
	}
	sent := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := a.wait(t, 15*time.Second)
	took := time.Since(sent)
	t.Logf("exited %d, %v after the signal (clean-up timeout 4 s)", code, took)
	if took > 1500*time.Millisecond {
		t.Fatalf("tenure took %v to exit after a signal during its clean-up", took)
	}
	if code != exitLostLead {
		t.Fatalf("exit %d, want %d (leadership lost); stderr: %s", code, exitLostLead, a.stderr)
	}
}

// TestExec_CommandExitAndLossTogetherGiveTheCommandsStatus: when CMD has
// exited by itself and the term has ended by the time tenure looks (held
// here until both have happened: the term ends as its entry is deleted),
// tenure exits with CMD's status every time, not 4 at random.
func TestExec_CommandExitAndLossTogetherGiveTheCommandsStatus(t *testing.T) {
	v := env{"etcd", endpoint}
	cli := newClient(t, v.endpoint)
	for i := range 8 {
		key, dir := v.key(t), dirT(t)
		cmd := tenureCmd(append(append([]string{"exec"}, v.flags("")...), "--key", key, "--",
			"sh", "-c", `echo $$ > `+path(dir, "pid")+`; exit 5`)...)
		cmd.Env = append(cmd.Env, "TENURE_TEST_HOLD_BEFORE_SELECT="+dir)
		a := startCmd(t, cmd)
		waitFile(t, path(dir, "loop-held"), 10*time.Second)
		mustDie(t, pidIn(t, path(dir, "pid")), 5*time.Second, "the command")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cli.Delete(ctx, key+"/", clientv3.WithPrefix())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the elector sees its entry gone
		if err := os.WriteFile(path(dir, "loop-go"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if code := a.wait(t, 10*time.Second); code != 5 {
			t.Fatalf("run %d: exit %d, want the command's 5 (it exited before the loss was acted on); stderr: %s", i, code, a.stderr)
		}
	}
}

// holdKey makes an Elector "holder" lead key until the test ends.
func holdKey(t *testing.T, v env, key string) {
	t.Helper()
	holder, err := election.New(v.electionBackend(t, 5*time.Second), election.Config{Key: key, Identity: "holder", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	if _, err := holder.Campaign(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// signalTwice sends p SIGTERM, checks that p still runs 300 ms later (the
// first signal alone must not end it, or the second shows nothing), sends
// a second SIGTERM, and returns p's exit status and how long after the
// second signal it exited (failing t if not within wait).
func signalTwice(t *testing.T, p *proc, wait time.Duration) (code int, took time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-p.done:
		t.Fatalf("tenure exited %d on the first signal, before the test could send the second; stderr: %s", p.code, p.stderr)
	default:
	}
	second := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code = p.wait(t, wait)
	return code, time.Since(second)
}
