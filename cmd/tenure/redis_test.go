package main

import (
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/internal/redisserver"
)

// redisExec returns tenure exec's arguments on the test's Redis server.
func redisExec(args ...string) []string {
	return append([]string{"exec", "--backend", "redis", "--endpoints", redisEndpoint}, args...)
}

// TestExecRedis_FourNoWaitOneRuns is the cron scenario: four replicas start
// the same job with --no-wait at once; exactly one runs it, the other three
// exit 0 while it still runs (they do not wait for the lock), and each
// run's --metrics-file counts what it did.
func TestExecRedis_FourNoWaitOneRuns(t *testing.T) {
	key, dir := testKey(t), dirT(t)
	type run struct {
		p       *proc
		id      string
		started time.Time
		exited  chan time.Time
		at      time.Time // when it exited
	}
	var runs []*run
	for i := range 4 {
		r := &run{id: string(rune('a' + i)), started: time.Now(), exited: make(chan time.Time, 1)}
		r.p = start(t, redisExec("--key", key, "--ttl", "4s", "--no-wait", "--identity", r.id,
			"--metrics-file", path(dir, r.id+".prom"), "--",
			"sh", "-c", `echo `+r.id+` >> `+path(dir, "ran")+`; sleep 2`)...)
		go func() { <-r.p.done; r.exited <- time.Now() }()
		runs = append(runs, r)
	}
	var runner *run
	var skippers []*run
	for _, r := range runs {
		if code := r.p.wait(t, 15*time.Second); code != 0 {
			t.Fatalf("replica %s exited %d; stderr: %s", r.id, code, r.p.stderr)
		}
		r.at = <-r.exited
		prom, err := os.ReadFile(path(dir, r.id+".prom"))
		if err != nil {
			t.Fatalf("replica %s wrote no metrics file: %v", r.id, err)
		}
		if strings.Contains(string(prom), "go_goroutines") || strings.Contains(string(prom), "process_") {
			t.Errorf("replica %s's metrics file holds Go runtime or process series, which clash in node_exporter:\n%s", r.id, prom)
		}
		if strings.Contains(r.p.stderr.String(), "is held by") {
			skippers = append(skippers, r)
			t.Logf("replica %s skipped %v after its start", r.id, r.at.Sub(r.started))
			if !strings.Contains(string(prom), `tenure_skipped_total{backend="redis",key="`+key+`"} 1`) {
				t.Errorf("replica %s skipped, but its metrics say:\n%s", r.id, prom)
			}
			if strings.Contains(string(prom), "tenure_exec_exit_code") {
				t.Errorf("replica %s skipped, but its metrics give an exit code:\n%s", r.id, prom)
			}
			continue
		}
		if runner != nil {
			t.Fatalf("replicas %s and %s both ran", runner.id, r.id)
		}
		runner = r
		if !strings.Contains(string(prom), `tenure_transitions_total{backend="redis",key="`+key+`",reason="elected"} 1`) ||
			!strings.Contains(string(prom), `tenure_exec_exit_code{key="`+key+`"} 0`) {
			t.Errorf("replica %s ran, but its metrics say:\n%s", r.id, prom)
		}
	}
	b, err := os.ReadFile(path(dir, "ran"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Fields(string(b)); runner == nil || len(skippers) != 3 || len(lines) != 1 || lines[0] != runner.id {
		t.Fatalf("the job ran as %q; %d replicas skipped: want exactly one run and three skips", lines, len(skippers))
	}
	// The job sleeps 2 s: a replica that waited for the lock exits after it.
	for _, r := range skippers {
		if !r.at.Before(runner.at) {
			t.Errorf("replica %s skipped at %v, after replica %s's job ended (%v): it waited for the lock", r.id, r.at, runner.id, runner.at)
		}
	}
}

// TestExecRedis_MetricsFileSaysTheCommandFailed: a job that took the
// lock and failed must not look, to an alert reading --metrics-file, like
// one that did the work: tenure_transitions_total says "elected" either
// way; tenure_exec_exit_code says how it ended.
func TestExecRedis_MetricsFileSaysTheCommandFailed(t *testing.T) {
	key, dir := testKey(t), dirT(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"sh", "-c", "exit 3"}, "3"},
		{[]string{"/nonexistent/report"}, "127"},
	} {
		file := path(dir, "run.prom")
		p := start(t, redisExec(append([]string{"--key", key, "--no-wait", "--metrics-file", file, "--"}, c.args...)...)...)
		code := p.wait(t, 15*time.Second)
		prom, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if want := `tenure_exec_exit_code{key="` + key + `"} ` + c.want; !strings.Contains(string(prom), want) || strconv.Itoa(code) != c.want {
			t.Errorf("%v: exit %d, metrics file without %q:\n%s", c.args, code, want, prom)
		}
	}
}

// TestExecRedis_WatchdogKeepsLongJob: a job that runs three times its TTL
// keeps the lock (the watchdog extends it); a waiter starts only after the
// job ends.
func TestExecRedis_WatchdogKeepsLongJob(t *testing.T) {
	key, dir := testKey(t), dirT(t)
	a := start(t, redisExec("--key", key, "--ttl", "1s", "--grace", "100ms", "--",
		"sh", "-c", `date +%s%N > `+path(dir, "a-start")+`; sleep 3; date +%s%N > `+path(dir, "a-end"))...)
	waitFile(t, path(dir, "a-start"), 10*time.Second)
	b := start(t, redisExec("--key", key, "--ttl", "1s", "--grace", "100ms", "--", "sh", "-c", `date +%s%N > `+path(dir, "b-start"))...)
	if code := a.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("the long job exited %d; stderr: %s", code, a.stderr)
	}
	if code := b.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("the waiter exited %d; stderr: %s", code, b.stderr)
	}
	aEnd := nanos(t, waitFile(t, path(dir, "a-end"), time.Second))
	bStart := nanos(t, waitFile(t, path(dir, "b-start"), time.Second))
	if !bStart.After(aEnd) {
		t.Fatalf("the waiter started at %v, before the 3 s job (TTL 1 s) ended at %v", bStart, aEnd)
	}
	t.Logf("the waiter started %v after the 3 s job ended (TTL 1 s)", bStart.Sub(aEnd))
}

// TestExecRedis_KilledHolderExpires: a SIGKILLed holder's key expires after
// the TTL and the next waiter enters.
func TestExecRedis_KilledHolderExpires(t *testing.T) {
	key, dir := testKey(t), dirT(t)
	a := start(t, redisExec("--key", key, "--ttl", "2s", "--",
		"sh", "-c", `echo $$ > `+path(dir, "a-pid")+`; exec sleep 60`)...)
	pidIn(t, path(dir, "a-pid"))
	start(t, redisExec("--key", key, "--ttl", "2s", "--", "sh", "-c", `date +%s%N > `+path(dir, "b-start"))...)
	time.Sleep(300 * time.Millisecond) // b is waiting
	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	bStart := nanos(t, waitFile(t, path(dir, "b-start"), 10*time.Second))
	took := bStart.Sub(killed)
	t.Logf("redis: holder SIGKILLed → next command started in %v (TTL 2s)", took)
	// The key lives up to TTL after the last extension (at most TTL/3
	// before the kill); the waiter wakes when it expires.
	if took < time.Second || took > 2*time.Second+500*time.Millisecond {
		t.Fatalf("failover took %v: want between 2/3 TTL (the key outlives the holder) and TTL + 0.5 s", took)
	}
}

// TestExecRedis_BadInput: a closed port and options for other backends are
// clear errors (exit 2).
func TestExecRedis_BadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--backend", "redis", "--endpoints", "127.0.0.1:1", "--dial-timeout", "500ms", "--key", "k", "--", "true"}, "cannot reach redis at 127.0.0.1:1"},
		{[]string{"exec", "--backend", "redis", "--endpoints", "127.0.0.1:1,127.0.0.1:2", "--dial-timeout", "500ms", "--key", "k", "--", "true"}, "0 of 2 masters answered"},
		{redisExec("--key", "a b", "--", "true"), "contains a space"},
		{redisExec("--key", "k", "--ttl", "50ms", "--", "true"), "TTL 50ms"},
		{redisExec("--key", "k", "--zk-acl", "creator", "--", "true"), "zk-acl"},
	} {
		p := start(t, c.args...)
		if code := p.wait(t, 10*time.Second); code != exitUsage || !strings.Contains(p.stderr.String(), c.want) {
			t.Errorf("tenure %v: exit %d, stderr %q; want exit %d naming %q", c.args, code, p.stderr, exitUsage, c.want)
		}
		// go-redis prints pool failures on its own unless told not to.
		if msg := strings.TrimSuffix(p.stderr.String(), "\n"); strings.Contains(msg, "\n") {
			t.Errorf("tenure %v: stderr is not one line: %q", c.args, msg)
		}
	}
}

// TestExecRedis_Auth: with requirepass, tenure exec authenticates with
// --user and TENURE_PASSWORD; without them it fails at once, naming the
// refusal, never the password.
func TestExecRedis_Auth(t *testing.T) {
	s, err := redisserver.Start(dirT(t), redisserver.Options{Password: "cli-s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	dir := dirT(t)
	args := []string{"exec", "--backend", "redis", "--endpoints", s.Addr(), "--key", testKey(t), "--log-level", "debug", "--"}
	p := start(t, append(args, "touch", path(dir, "no-password"))...)
	if code := p.wait(t, 10*time.Second); code != exitUsage || !strings.Contains(p.stderr.String(), "NOAUTH") {
		t.Fatalf("without a password: exit %d, stderr %q; want exit %d naming NOAUTH", code, p.stderr, exitUsage)
	}
	cmd := tenureCmd(append(append([]string{}, args[:len(args)-1]...), "--user", "default", "--", "touch", path(dir, "ran"))...)
	cmd.Env = append(cmd.Env, "TENURE_PASSWORD=cli-s3cret")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("with the password: %v; output %q", err, out)
	}
	if _, err := os.Stat(path(dir, "ran")); err != nil {
		t.Fatal("the command did not run with the password")
	}
	if strings.Contains(string(out), "cli-s3cret") || strings.Contains(p.stderr.String(), "cli-s3cret") {
		t.Fatalf("the password was printed: %q", out)
	}
}

// TestExecRedis_ServerStartingLateIsReached: like etcd's and ZooKeeper's
// clients, tenure keeps trying a Redis that refuses connections until the
// dial timeout, instead of giving up after one refused dial: a server
// that comes up half a second later is used.
func TestExecRedis_ServerStartingLateIsReached(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // refused until the forwarder below listens
	late := make(chan net.Listener, 1)
	t.Cleanup(func() {
		if ln := <-late; ln != nil {
			ln.Close() // ends the forwarder
		}
	})
	go func() {
		time.Sleep(500 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		late <- ln
		if err != nil {
			return // the run below then fails, saying why
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", redisEndpoint)
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	out, code := runCLI(t, "exec", "--backend", "redis", "--endpoints", addr, "--dial-timeout", "5s", "--key", testKey(t), "--", "true")
	if code != 0 {
		t.Fatalf("exec against a Redis that listens 0.5 s late: exit %d, %s", code, out)
	}
}

// TestExecRedis_SignalWhileDialingEnds: a signal while tenure keeps trying
// an unreachable Redis ends it at once, with 128+N.
func TestExecRedis_SignalWhileDialingEnds(t *testing.T) {
	needSignal(t, os.Interrupt)
	p := start(t, "exec", "--backend", "redis", "--endpoints", "127.0.0.1:1", "--dial-timeout", "30s", "--key", testKey(t), "--", "true")
	time.Sleep(500 * time.Millisecond)
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 5*time.Second); code != 130 {
		t.Fatalf("exit %d after SIGINT while dialing, want 130; stderr: %s", code, p.stderr)
	}
}

// silentEndpoint is an address that accepts connections and never
// answers (a hung server, or a firewall dropping what it gets after the
// handshake): a blackholed proxy.
func silentEndpoint(t *testing.T) string {
	t.Helper()
	p := newProxy(t, redisEndpoint)
	p.Blackhole()
	return p.Addr()
}

// TestExecRedis_SilentEndpointIsNamed: an endpoint that accepts and never
// answers is reported like a refused one (exit 2, "cannot reach redis at
// ADDR"), not as a bare "context deadline exceeded"; with several
// masters, the silent ones are named.
func TestExecRedis_SilentEndpointIsNamed(t *testing.T) {
	one, two := silentEndpoint(t), silentEndpoint(t)
	for _, c := range []struct {
		endpoints string
		want      []string
	}{
		{one, []string{"cannot reach redis at " + one}},
		{one + "," + two, []string{"0 of 2 masters answered", one, two}},
	} {
		p := start(t, "exec", "--backend", "redis", "--endpoints", c.endpoints, "--dial-timeout", "700ms", "--key", "k", "--", "true")
		code := p.wait(t, 10*time.Second)
		msg := p.stderr.String()
		if code != exitUsage {
			t.Errorf("endpoints %s: exit %d, want %d; stderr %q", c.endpoints, code, exitUsage, msg)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("endpoints %s: stderr %q does not say %q", c.endpoints, msg, w)
			}
		}
		if strings.Contains(strings.TrimSuffix(msg, "\n"), "\n") {
			t.Errorf("endpoints %s: stderr is not one line: %q", c.endpoints, msg)
		}
	}
}
