package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/etcdembed"
)

// TestEndpoints_DefaultIsTheBackendsPort: without --endpoints (and without
// TENURE_ENDPOINTS) each backend dials its own default port on this host,
// not etcd's; an --endpoints given empty is an error, not the default.
func TestEndpoints_DefaultIsTheBackendsPort(t *testing.T) {
	cases := []struct {
		backend, key, want string
	}{
		{"etcd", "k", "127.0.0.1:2379"},
		{"zk", "/k", "127.0.0.1:2181"},
		{"redis", "k", "127.0.0.1:6379"},
	}
	validate := func(args ...string) (common, error) {
		var c common
		fs := flag.NewFlagSet("exec", flag.ContinueOnError)
		c.register(fs)
		if _, err := parse(fs, args, io.Discard); err != nil {
			t.Fatal(err)
		}
		return c, c.validate()
	}

	t.Setenv("TENURE_ENDPOINTS", "") // restored after the test
	os.Unsetenv("TENURE_ENDPOINTS")
	for _, c := range cases {
		cm, err := validate("--backend", c.backend, "--key", c.key)
		if err != nil {
			t.Fatalf("%s: %v", c.backend, err)
		}
		if eps, err := cm.endpointList(); err != nil || len(eps) != 1 || eps[0] != c.want {
			t.Errorf("%s without --endpoints dials %v (err %v), want %s", c.backend, eps, err, c.want)
		}
		if _, err := validate("--backend", c.backend, "--key", c.key, "--endpoints", ""); err == nil || !strings.Contains(err.Error(), "--endpoints is empty") {
			t.Errorf("%s with --endpoints \"\": validate = %v, want --endpoints is empty", c.backend, err)
		}
	}

	os.Setenv("TENURE_ENDPOINTS", "")
	for _, c := range cases {
		if _, err := validate("--backend", c.backend, "--key", c.key); err == nil || !strings.Contains(err.Error(), "--endpoints is empty") {
			t.Errorf("%s with TENURE_ENDPOINTS set empty: validate = %v, want --endpoints is empty", c.backend, err)
		}
	}
}

// TestLeader_ZKTTLIsTheObserversSessionTimeout: tenure leader on ZooKeeper
// opens its session with --ttl, so it works against a server whose session
// timeouts exclude the default 10 s (the bad-input cases show a --ttl the
// server refuses is named as such).
func TestLeader_ZKTTLIsTheObserversSessionTimeout(t *testing.T) {
	out, code := runCLI(t, "leader", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/"+testKey(t), "--ttl", "4s")
	if code != exitVacant || strings.TrimSpace(out) != "vacant" {
		t.Fatalf("tenure leader --ttl 4s on a vacant znode: %q, exit %d; want vacant, 3", out, code)
	}
}

// TestLeader_MemberWithoutQuorumFailsInTime: a member that has lost its
// cluster's quorum still answers the start-up status check, but can serve
// no linearizable read: `tenure leader` must fail within --dial-timeout
// (exit 1), not hang a script or a health check.
func TestLeader_MemberWithoutQuorumFailsInTime(t *testing.T) {
	c, err := etcdembed.StartCluster(dirT(t), 3, 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ep := c.Endpoints()[0]
	for _, i := range []int{1, 2} {
		if err := c.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * time.Second) // the survivor notices it has no leader
	// The client's own retries of "no leader" give up after about 2.5 s:
	// a 500 ms --dial-timeout must end the read well before they do.
	t0 := time.Now()
	p := start(t, "leader", "--key", "k", "--endpoints", ep, "--dial-timeout", "500ms")
	code := p.wait(t, 20*time.Second)
	took := time.Since(t0)
	t.Logf("tenure leader against a member without quorum: exit %d after %v; stderr: %s", code, took, p.stderr)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d", code, exitFailure)
	}
	if took > 2200*time.Millisecond { // below the client's own 2.5 s, room for a slow start on a busy machine
		t.Fatalf("tenure leader took %v with --dial-timeout 500ms: the read did not end at its timeout", took)
	}
	if !strings.Contains(p.stderr.String(), "--dial-timeout") {
		t.Fatalf("stderr %q does not say the read outlasted --dial-timeout", p.stderr)
	}
}

// TestLeader_ASilentFirstEndpointDoesNotHideTheOthers: of two etcd
// endpoints, the first accepts connections and never answers (a member
// powered off behind a dropped route). The endpoints were probed one after
// the other under one --dial-timeout, which the first used up: exit 2,
// "cannot reach etcd", while the second answered at once. They are probed
// together now.
func TestLeader_ASilentFirstEndpointDoesNotHideTheOthers(t *testing.T) {
	silent := newProxy(t, endpoint)
	silent.Blackhole()
	start := time.Now()
	out, code := runCLI(t, "leader", "--backend", "etcd", "--endpoints", silent.Addr()+","+endpoint, "--key", testKey(t), "--dial-timeout", "3s")
	took := time.Since(start)
	if code != exitVacant || strings.TrimSpace(out) != "vacant" {
		t.Fatalf("tenure leader with a silent first endpoint: %q, exit %d after %v; want vacant, 3", out, code, took.Round(time.Millisecond))
	}
	if took > 2*time.Second {
		t.Errorf("took %v: the silent endpoint held up the one that answers", took.Round(time.Millisecond))
	}
}

// TestExec_ASilentEndpointDoesNotStrandTheWaiter: a waiter's client
// reaches etcd through two endpoints, and the one its watches run on goes
// silent (a dropped route: no reset, no answer). etcd's client sends a
// connection's watches on one gRPC stream, and without keepalive pings it
// never finds such a connection dead: the waiter never heard its
// predecessor go (not started 30 s after the release, before; etcdelect's
// own handling of a silent stream now starts it, but its release then
// waits on that connection). With tenure's keepalive (10 s, then 3 s for
// the answer)
// the connection is closed, the watches resume on the other endpoint, and
// the waiter starts.
func TestExec_ASilentEndpointDoesNotStrandTheWaiter(t *testing.T) {
	v := env{"etcd", endpoint}
	key, dir := v.key(t), dirT(t)
	release := path(dir, "release")
	h := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--", "sh", "-c", `while [ ! -e `+release+` ]; do sleep 0.01; done`)...)
	v.waitQueued(t, key, 1)
	// The second endpoint refuses at first, so that the waiter's client
	// queues and watches through the first.
	first, second := newProxy(t, endpoint), newProxy(t, endpoint)
	second.Refuse()
	w := start(t, append(append([]string{"exec"}, v.flags(first.Addr()+","+second.Addr())...), "--key", key, "--ttl", "10s", "--", "sh", "-c", `date +%s%N > `+path(dir, "w-start"))...)
	v.waitQueued(t, key, 2)
	if err := second.Listen(); err != nil {
		t.Fatal(err)
	}
	// The client's next connection attempt (gRPC backs off between them)
	// reaches the second.
	for deadline := time.Now().Add(60 * time.Second); second.Accepted() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter's client did not connect to the second endpoint in 60 s")
		}
	}
	time.Sleep(500 * time.Millisecond) // the connection's handshake
	first.Blackhole()
	time.Sleep(time.Second)
	released := time.Now()
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := h.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("the holder exited %d; stderr: %s", code, h.stderr)
	}
	for {
		if _, err := os.Stat(path(dir, "w-start")); err == nil {
			break
		}
		if time.Since(released) > 30*time.Second {
			t.Fatalf("the waiter's command has not started 30 s after the holder released; stderr: %s", w.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(released)
	if code := w.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("the waiter exited %d; stderr: %s", code, w.stderr)
	}
	t.Logf("the waiter started %v after the release, its first endpoint silent since 1 s before it", took.Round(time.Millisecond))
}

// TestEndpoints_MalformedAreRefusedAtOnce: an endpoint whose port is not a
// number from 1 to 65535, or whose host holds a space, is refused before
// anything is dialled (exit 2), not after a --dial-timeout spent trying.
func TestEndpoints_MalformedAreRefusedAtOnce(t *testing.T) {
	for _, backend := range []string{"etcd", "zk"} {
		key := "k"
		if backend == "zk" {
			key = "/k"
		}
		for _, ep := range []string{"127.0.0.1:abc", "a b:2379", "127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:-1"} {
			start := time.Now()
			_, errOut, code := runTenure(t, nil, "leader", "--backend", backend, "--endpoints", ep, "--key", key, "--dial-timeout", "5s")
			if code != 2 || !strings.Contains(errOut, "is not HOST:PORT") {
				t.Errorf("%s --endpoints %q: exit %d, stderr %q; want 2, is not HOST:PORT", backend, ep, code, errOut)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("%s --endpoints %q refused after %v", backend, ep, took.Round(time.Millisecond))
			}
		}
	}
}

// TestLeader_SignalEndsTheLoginToASilentEndpoint: with --user, the etcd
// client logs in while it connects, on its own context, bounded by
// --dial-timeout only: a SIGINT during that login was ignored until the
// timeout (15 s here). It ends it now (exit 130).
func TestLeader_SignalEndsTheLoginToASilentEndpoint(t *testing.T) {
	silent := newProxy(t, endpoint)
	silent.Blackhole()
	p := tenureCmd("leader", "--backend", "etcd", "--endpoints", silent.Addr(), "--key", testKey(t), "--user", "someone", "--dial-timeout", "15s")
	p.Env = append(p.Env, "TENURE_PASSWORD=not-a-secret")
	var stderr strings.Builder
	p.Stderr = &stderr
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		p.Wait()
		done <- p.ProcessState.ExitCode()
	}()
	waitCaught(t, p.Process.Pid, syscall.SIGINT) // its handler set: it is connecting
	time.Sleep(500 * time.Millisecond)           // and logging in
	signaled := time.Now()
	if err := p.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		took := time.Since(signaled)
		if code != 130 || took > 3*time.Second {
			t.Fatalf("exit %d %v after SIGINT, want 130 within 3 s; stderr: %s", code, took.Round(time.Millisecond), stderr.String())
		}
		t.Logf("exit %d %v after SIGINT", code, took.Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		p.Process.Kill()
		<-done
		t.Fatalf("still connecting 10 s after SIGINT; stderr: %s", stderr.String())
	}
}

// waitCaught waits (up to 10 s) until process pid catches sig: its
// /proc status lists sig in SigCgt.
func waitCaught(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if hex, ok := strings.CutPrefix(line, "SigCgt:"); ok {
				if mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64); err == nil && mask&(1<<(uint(sig)-1)) != 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d does not catch %v 10 s on", pid, sig)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
