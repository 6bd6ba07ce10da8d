package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
)

// TestBadInput_ClearOneLineErrorExit2: bad input gives one line on stderr
// and exit 2, never a panic or a hang.
func TestBadInput_ClearOneLineErrorExit2(t *testing.T) {
	// A server with etcd's default timing refuses leases under 2 s.
	dir := t.TempDir()
	slow, err := etcdembed.StartTimed(dir, 100, 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown backend", []string{"exec", "--backend", "consul", "--key", "k", "--", "true"}, "unknown backend"},
		{"empty key", []string{"exec", "--endpoints", endpoint, "--", "true"}, "--key is required"},
		{"control char in key", []string{"exec", "--endpoints", endpoint, "--key", "a\nb", "--", "true"}, "control character"},
		{"sub-second ttl", []string{"exec", "--endpoints", endpoint, "--key", "k", "--ttl", "500ms", "--", "true"}, "whole seconds"},
		{"fractional ttl", []string{"exec", "--endpoints", endpoint, "--key", "k", "--ttl", "1500ms", "--", "true"}, "whole seconds"},
		{"ttl under the server's minimum", []string{"exec", "--endpoints", slow.Endpoint, "--key", "k", "--ttl", "1s", "--grace", "0s", "--", "true"}, "minimum lease TTL"},
		{"grace too long for ttl", []string{"exec", "--endpoints", endpoint, "--key", "k", "--ttl", "2s", "--grace", "5s", "--", "true"}, "--grace"},
		{"no command", []string{"exec", "--endpoints", endpoint, "--key", "k"}, "no command"},
		{"bad endpoint", []string{"exec", "--endpoints", "localhost", "--key", "k", "--", "true"}, "not HOST:PORT"},
		{"zk endpoint with a scheme", []string{"exec", "--backend", "zk", "--endpoints", "http://" + zkEndpoint, "--key", "/k", "--", "true"}, "without a scheme"},
		// The probe only times out; the message says why (a refused dial).
		{"unreachable endpoint", []string{"exec", "--endpoints", "127.0.0.1:1", "--dial-timeout", "1s", "--key", "k", "--", "true"}, "cannot reach etcd at 127.0.0.1:1 within 1s"},
		{"refused endpoint says so", []string{"exec", "--endpoints", "127.0.0.1:1", "--dial-timeout", "1s", "--key", "k", "--", "true"}, "127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused"},
		{"ttl above etcd's longest lease", []string{"exec", "--endpoints", endpoint, "--key", "k", "--ttl", "2562047h", "--", "true"}, "longer than etcd's longest lease"},
		{"unknown flag", []string{"exec", "--bogus", "--key", "k", "--", "true"}, "flag provided but not defined"},
		{"leader without key", []string{"leader", "--endpoints", endpoint}, "--key is required"},
		{"leader unreachable", []string{"leader", "--endpoints", "127.0.0.1:1,127.0.0.1:2", "--dial-timeout", "1s", "--key", "k"}, "127.0.0.1:1: dial tcp 127.0.0.1:1: connect: connection refused; 127.0.0.1:2: dial tcp"},
		{"bad env", []string{"exec", "--key", "k", "--", "true"}, `TENURE_TTL="soon": parse error, want a duration such as 5s or 1m30s (it sets --ttl)`},
		{"unknown command", []string{"elect"}, "unknown command"},
		{"guard argument not NAME=VALUE", []string{"__guard", "TENURE_TERM=1", "kill-all"}, "internal command"},
		{"bad log level", []string{"exec", "--endpoints", endpoint, "--key", "k", "--log-level", "loud", "--", "true"}, "--log-level"},
		{"bad log format", []string{"exec", "--endpoints", endpoint, "--key", "k", "--log-format", "xml", "--", "true"}, "--log-format"},
		{"bad metrics addr", []string{"exec", "--endpoints", endpoint, "--key", "k", "--metrics-addr", "nowhere:-1", "--", "true"}, "--metrics-addr"},
		{"zk relative key", []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "locks/a", "--", "true"}, "absolute path"},
		{"zk key under /zookeeper", []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/zookeeper/x", "--", "true"}, "reserves"},
		{"zk grace too long for ttl", []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k", "--ttl", "2s", "--grace", "1s", "--", "true"}, "--grace 1s is too long for --ttl 2s on ZooKeeper"},
		{"zk sub-second ttl", []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k", "--ttl", "500ms", "--grace", "0s", "--", "true"}, "at least 1s"},
		{"zk ttl above the server's maximum", []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k", "--ttl", "30s", "--", "true"}, "negotiated"},
		{"zk leader ttl above the server's maximum", []string{"leader", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k", "--ttl", "30s"}, "negotiated"},
		{"zk leader sub-second ttl", []string{"leader", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k", "--ttl", "500ms"}, "at least 1s"},
		{"zk unreachable", []string{"exec", "--backend", "zk", "--endpoints", "127.0.0.1:1", "--dial-timeout", "1s", "--key", "/k", "--", "true"}, "cannot reach zookeeper"},
		// The line starts "tenure exec: ", not "tenure exec: tenure: ".
		{"one program name", []string{"exec", "--endpoints", endpoint, "--key", "k", "--ttl", "500ms", "--", "true"}, "tenure exec: invalid configuration: etcd: TTL 500ms"},
		// A value from the environment is named as such.
		{"env value refused", []string{"exec", "--endpoints", endpoint, "--key", "k", "--", "true"}, "--dial-timeout 0s must be positive (--dial-timeout comes from TENURE_DIAL_TIMEOUT)"},
		{"leader env value refused", []string{"leader", "--key", "k"}, "--endpoints is empty (--endpoints comes from TENURE_ENDPOINTS)"},
		// Inside a tenure exec command, TENURE_KEY is not exec's --key.
		{"nested exec without key", []string{"exec", "--endpoints", endpoint, "--", "true"}, "inside a tenure exec command TENURE_KEY names the lock the command runs under"},
		// A malformed --metrics-addr is refused before the backend is
		// dialled (here unreachable, which would take the dial timeout).
		{"bad metrics addr first", []string{"exec", "--endpoints", "127.0.0.1:1", "--dial-timeout", "10s", "--key", "k", "--metrics-addr", "nowhere:-1", "--", "true"}, `--metrics-addr "nowhere:-1": port "-1" is not a number from 0 to 65535`},
	}
	env := map[string][]string{
		"bad env":                  {"TENURE_TTL=soon"},
		"env value refused":        {"TENURE_DIAL_TIMEOUT=0"},
		"leader env value refused": {"TENURE_ENDPOINTS="},
		"nested exec without key":  {"TENURE_TERM=7", "TENURE_KEY=outer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := tenureCmd(c.args...)
			p.Env = append(p.Env, env[c.name]...)
			start := time.Now()
			var stderr strings.Builder
			p.Stderr = &stderr
			if err := p.Start(); err != nil {
				t.Fatal(err)
			}
			if code := exitWithin(t, p, 15*time.Second, "tenure"); code != exitUsage {
				t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
			}
			msg := stderr.String()
			if strings.Contains(msg, "panic") || strings.Contains(msg, "goroutine ") {
				t.Fatalf("panicked: %s", msg)
			}
			if !strings.Contains(msg, c.want) {
				t.Fatalf("stderr %q does not contain %q", msg, c.want)
			}
			if !strings.HasPrefix(msg, "tenure") {
				t.Fatalf("stderr %q does not start with tenure", msg)
			}
			if c.name == "bad metrics addr first" && time.Since(start) > 5*time.Second {
				t.Fatalf("refused after %v: after the dial timeout, not before the dial", time.Since(start))
			}
			// An unknown command is followed by the usage, after a blank line.
			if first, rest, _ := strings.Cut(strings.TrimSuffix(msg, "\n"), "\n"); rest != "" && (c.name != "unknown command" || !strings.HasPrefix(rest, "\ntenure: leader election")) {
				t.Fatalf("stderr is not one line: %q, then %q", first, rest)
			}
		})
	}
}

func TestLeader_PrintsHolderAndExits3WhenVacant(t *testing.T) {
	key := testKey(t)
	out, code := runCLI(t, "leader", "--endpoints", endpoint, "--key", key)
	if code != exitVacant || strings.TrimSpace(out) != "vacant" {
		t.Fatalf("vacant key: %q, exit %d; want vacant, 3", out, code)
	}
	cli := newClient(t, endpoint)
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "node-1", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	term, err := e.Campaign(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out, code = runCLI(t, "leader", "--endpoints", endpoint, "--key", key)
	if want := "node-1 term=" + itoa(term.Token); code != 0 || strings.TrimSpace(out) != want {
		t.Fatalf("held key: %q, exit %d; want %q, 0", out, code, want)
	}
	t.Setenv("TENURE_ENDPOINTS", endpoint) // flags come from the environment too
	out, code = runCLI(t, "leader", "--key", key, "--json")
	var got leaderJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 {
		t.Fatalf("--json: %q, exit %d, %v", out, code, err)
	}
	if got.Vacant || got.Identity != "node-1" || got.Term != term.Token || got.Key != key || got.Backend != "etcd" {
		t.Fatalf("--json = %+v", got)
	}
}

func TestLeader_WatchReportsChanges(t *testing.T) {
	needSignal(t, os.Interrupt)
	key := testKey(t)
	p := tenureCmd("leader", "--endpoints", endpoint, "--key", key, "--watch")
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.Stdout = w
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	defer r.Close()
	lines := make(chan string, 16)
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := r.Read(buf)
			acc += string(buf[:n])
			for i := strings.IndexByte(acc, '\n'); i >= 0; i = strings.IndexByte(acc, '\n') {
				lines <- acc[:i]
				acc = acc[i+1:]
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	next := func() string {
		select {
		case l := <-lines:
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("no line from --watch")
			return ""
		}
	}
	if l := next(); l != "vacant" {
		t.Fatalf("first line %q, want vacant", l)
	}
	cli := newClient(t, endpoint)
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: "w1", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	term, err := e.Campaign(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if l, want := next(), "w1 term="+itoa(term.Token); l != want {
		t.Fatalf("line %q, want %q", l, want)
	}
	if err := e.Resign(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l := next(); l != "vacant" {
		t.Fatalf("after resign %q, want vacant", l)
	}
	_ = p.Process.Signal(os.Interrupt)
	if err := p.Wait(); err != nil {
		t.Fatalf("--watch after SIGINT: %v", err)
	}
}

func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	p := tenureCmd(args...)
	var stderr strings.Builder
	p.Stderr = &stderr
	out, _ := p.Output()
	if stderr.Len() > 0 {
		t.Logf("stderr: %s", stderr.String())
	}
	return string(out), p.ProcessState.ExitCode()
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// TestHelp_GoesToStdout: help asked for is the answer, on stdout (so that
// `tenure exec --help | less` shows it), with status 0 and nothing on
// stderr.
func TestHelp_GoesToStdout(t *testing.T) {
	for _, sub := range []string{"exec", "leader", "demo"} {
		out, errOut, code := runTenure(t, nil, sub, "--help")
		if code != 0 || !strings.Contains(out, "Usage: tenure "+sub) || errOut != "" {
			t.Errorf("tenure %s --help: exit %d, stdout %q, stderr %q; want 0, the usage on stdout, nothing on stderr", sub, code, out, errOut)
		}
	}
}

// TestLeader_WatchEndsWhenItsReaderIsGone: `tenure leader --watch | head
// -1`: head exits after the first line. The watch must end then (exit 0),
// not when the next change would have been printed, which may be days
// away: here the key never changes again.
func TestLeader_WatchEndsWhenItsReaderIsGone(t *testing.T) {
	v := env{"etcd", endpoint}
	key := v.key(t)
	p, r, stderr := startOnPipe(t, false, append(append([]string{"leader"}, v.flags("")...), "--key", key, "--watch")...)
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || line != "vacant\n" {
		t.Fatalf("first line %q, %v; want vacant", line, err)
	}
	r.Close() // the reader goes
	start := time.Now()
	if code := exitWithin(t, p, 5*time.Second, "tenure leader --watch"); code != exitOK {
		t.Fatalf("exit %d, want 0; stderr: %s", code, stderr.String())
	}
	t.Logf("tenure leader --watch ended %v after its reader went", time.Since(start))
}

// TestFlags_BadEnvironmentValueYieldsToTheFlag: a flag on the command line
// wins over its TENURE_<FLAG> variable, also when the variable does not
// parse; and --help helps whatever the environment. Before, both exited 2
// with `TENURE_TTL="soon": parse error`.
func TestFlags_BadEnvironmentValueYieldsToTheFlag(t *testing.T) {
	env := []string{"TENURE_TTL=soon"}
	_, errOut, code := runTenure(t, env, "exec", "--endpoints", endpoint, "--key", testKey(t), "--ttl", "10s", "--", "true")
	if code != 0 {
		t.Errorf("TENURE_TTL=soon tenure exec --ttl 10s ... -- true: exit %d, want 0; stderr: %s", code, errOut)
	}
	out, errOut, code := runTenure(t, env, "exec", "--help")
	if code != 0 || !strings.Contains(out, "Usage: tenure exec") {
		t.Errorf("TENURE_TTL=soon tenure exec --help: exit %d, stdout %q, stderr %q; want 0 and the usage", code, out, errOut)
	}
}

// TestLeader_ReaderGoneBeforeTheAnswerKeepsTheExitStatus: `tenure leader
// ... | true` (the reader gone before the line is written) exits with the
// table's status (3: vacant), not killed by SIGPIPE (141 in a shell),
// which Go's runtime does on a write to stdout unless SIGPIPE is caught.
func TestLeader_ReaderGoneBeforeTheAnswerKeepsTheExitStatus(t *testing.T) {
	v := env{"etcd", endpoint}
	key := v.key(t)
	for _, extra := range [][]string{nil, {"--json"}} {
		p, _, stderr := startOnPipe(t, true, append(append(append([]string{"leader"}, v.flags("")...), "--key", key), extra...)...)
		code := exitWithin(t, p, 10*time.Second, "tenure leader")
		if ws, ok := p.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			t.Fatalf("tenure leader %v with its reader gone died of %v; stderr: %s", extra, ws.Signal(), stderr.String())
		}
		if code != exitVacant {
			t.Fatalf("tenure leader %v with its reader gone: exit %d, want %d (vacant); stderr: %s", extra, code, exitVacant, stderr.String())
		}
	}
}

// startOnPipe starts tenure with args, its stdout the write end of a pipe,
// and returns the process, the pipe's read end (the test's to close; nil
// with readerGone, which closes it before tenure starts) and tenure's
// stderr.
func startOnPipe(t *testing.T, readerGone bool, args ...string) (*exec.Cmd, *os.File, *strings.Builder) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if readerGone {
		r.Close()
		r = nil
	}
	p := tenureCmd(args...)
	p.Stdout = w
	stderr := &strings.Builder{}
	p.Stderr = stderr
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return p, r, stderr
}
