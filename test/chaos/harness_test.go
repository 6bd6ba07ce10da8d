package chaos

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/internal/faultproxy"
)

// run is one run of one scenario on one backend: lanes independent
// elections (keys), each with three candidate processes behind their own
// fault proxies, rounds faults per lane, then every candidate stopped and
// the invariants checked.
type run struct {
	id       string
	be       backend
	srv      servers
	reg      *register
	sc       scenario
	lanes    []*lane
	rounds   int
	ttl      time.Duration
	every    time.Duration
	broken   string
	start    int64
	logf     func(format string, args ...any)
	harness  []string // harness failures (not invariant violations)
	harnessM sync.Mutex

	partitions    atomic.Int32 // partitions made (one per round: a server fault covers every lane)
	partitionHits atomic.Int32 // partitions that cut off a server a leader's session was on
}

func (r *run) fail(format string, args ...any) {
	r.harnessM.Lock()
	defer r.harnessM.Unlock()
	r.harness = append(r.harness, fmt.Sprintf(format, args...))
}

// failed reports whether the harness has failed.
func (r *run) failed() bool {
	r.harnessM.Lock()
	defer r.harnessM.Unlock()
	return len(r.harness) > 0
}

// lane is one election key and what the checker learned about it.
type lane struct {
	r     *run
	idx   int
	key   string
	slots []*slot

	mu      sync.Mutex
	terms   []*termInfo
	byTok   map[procTok]*termInfo // a Redis restart starts tokens again at 1: by process too
	ops     []*opRec
	open    map[string]*opRec // proc id + op number → op without an answer yet
	faults  []faultRec
	windows [][2]int64    // mono times from a fault to its bound after its undo: a leaderless stretch there is the fault's
	changed chan struct{} // closed and replaced on every event

	leftovers []string // LEFT reports of candidates that exited
}

// procTok names a term by its process and token.
type procTok struct {
	p   *proc
	tok uint64
}

// slot is one candidate position of a lane: its proxies (one per server)
// outlive the processes that run in it (a killed candidate is replaced by a
// new one in the same slot).
type slot struct {
	l       *lane
	idx     int
	gen     int
	proxies []*faultproxy.Proxy
	proc    *proc
}

// proc is one candidate process.
type proc struct {
	id     string
	s      *slot
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}

	// guarded by the lane's mu
	killedAt int64
	quitAt   int64 // SIGQUIT (diagnose): its exit status 2 is expected
	exitAt   int64
	stops    []int64 // SIGSTOP times
	conts    []int64 // SIGCONT times
	frozen   bool
}

// termInfo is one term as the candidate that held it reported it.
type termInfo struct {
	token      uint64
	p          *proc
	entry      string
	zkSession  int64
	zkPassword []byte
	start      int64 // OnElected began
	ctxEnd     int64 // its context ended (0: not seen)
	workEnd    int64 // OnElected returned (0: not seen)
	expiredAt  int64 // the checker expired its session on the server (guarded by the lane's mu)
}

// opRec is one register operation as a candidate reported it.
type opRec struct {
	proc      string
	write     bool
	tok       uint64
	val       string
	call, ret int64  // ret 0: no answer seen
	res       string // writes: ok, stale, err; reads: the value, or err
	rtok      uint64 // reads: the token read
}

// faultRec is one fault injected into a lane and what followed.
type faultRec struct {
	at       int64 // mono() when injected
	old      uint64
	bound    time.Duration
	failover time.Duration // 0 when the old term was kept
	kept     bool
	// serverLeader: the server-side leader changed meanwhile, and the
	// bound was extended by TTL + ServerFailover (the sessions renewed).
	serverLeader bool
}

func (l *lane) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// wait returns a channel closed at the lane's next event.
func (l *lane) wait() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// spawn starts a new candidate process in s.
func (s *slot) spawn() error {
	l := s.l
	r := l.r
	s.gen++
	p := &proc{id: fmt.Sprintf("l%d.s%d.g%d", l.idx, s.idx, s.gen), s: s, exited: make(chan struct{})}
	var eps []string
	for _, px := range s.proxies {
		eps = append(eps, px.Addr())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envCandidate+"=1",
		envBackend+"="+r.be.name,
		envEndpoints+"="+strings.Join(eps, ","),
		envKey+"="+l.key,
		envID+"="+p.id,
		envTTL+"="+strconv.FormatInt(r.ttl.Milliseconds(), 10),
		envRegister+"="+r.reg.URL(),
		envEvery+"="+strconv.FormatInt(r.every.Milliseconds(), 10),
		envBroken+"="+r.broken,
		// Every other slot uses handover records on every queue: a
		// lane mixes sessions that write and read them with sessions
		// that do neither.
		envHandover+"="+strconv.Itoa(1-s.idx%2),
		"GOTRACEBACK=all",
	)
	cmd.Stderr = os.Stderr // where SIGQUIT's goroutine dump goes (diagnose)
	// The candidate dies with the test process, however it exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd = cmd
	s.proc = p
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l.event(p, sc.Text())
		}
		err := cmd.Wait()
		l.mu.Lock()
		if p.exitAt == 0 {
			p.exitAt = mono()
		}
		// A Go program exits with status 2 on a panic or a fatal error (and
		// on SIGQUIT, which diagnose sends): a candidate must never die so.
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 2 && p.quitAt == 0 {
			r.fail("candidate %s died with exit status 2 (a panic or fatal error: its stack is on stderr)", p.id)
		}
		l.notify()
		l.mu.Unlock()
		close(p.exited)
	}()
	return nil
}

// event records one line of p's output.
func (l *lane) event(p *proc, line string) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return
	}
	u := func(i int) uint64 {
		if i >= len(f) {
			return 0
		}
		n, _ := strconv.ParseUint(f[i], 10, 64)
		return n
	}
	i64 := func(i int) int64 { return int64(u(i)) }
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.notify()
	switch f[0] {
	case "ELECTED":
		t := &termInfo{token: u(1), p: p, start: i64(2)}
		if len(f) > 3 {
			t.entry = f[3]
		}
		if len(f) > 5 {
			t.zkSession, t.zkPassword = parseZKSession(f[4], f[5])
		}
		l.terms = append(l.terms, t)
		l.byTok[procTok{p, t.token}] = t
	case "CTXEND":
		if t := l.byTok[procTok{p, u(1)}]; t != nil {
			t.ctxEnd = i64(2)
		}
	case "WORKEND":
		if t := l.byTok[procTok{p, u(1)}]; t != nil {
			t.workEnd = i64(2)
		}
	case "W":
		if len(f) >= 5 {
			o := &opRec{proc: p.id, write: true, tok: u(2), val: f[3], call: i64(4)}
			l.ops = append(l.ops, o)
			l.open[p.id+"/"+f[1]] = o
		}
	case "R":
		o := &opRec{proc: p.id, call: i64(2)}
		l.ops = append(l.ops, o)
		l.open[p.id+"/"+f[1]] = o
	case "WR", "RR":
		k := p.id + "/" + f[1]
		o := l.open[k]
		if o == nil || len(f) < 4 {
			return
		}
		delete(l.open, k)
		o.ret = i64(2)
		o.res = f[3]
		if f[0] == "RR" && len(f) >= 5 {
			o.rtok, o.res = u(3), f[4]
		}
	case "EXIT":
		p.exitAt = i64(1)
		if len(f) < 3 || !strings.Contains(f[2], "canceled") { // Run returns tenure.ErrCanceled when asked to stop
			l.r.fail("%s exited: %s", p.id, f[2])
		}
	case "HARDSTOP":
		l.r.logf("%s: hard stop of term %s", p.id, f[1])
	case "LEFTERR":
		// The check of invariant 4 could not be made for this process: a
		// harness failure (a run that could not check proves nothing).
		l.r.fail("%s could not count the nodes its session kept: %s", p.id, strings.Join(f[2:], " "))
	case "LEFT":
		if n := u(1); n > 0 {
			l.leftovers = append(l.leftovers, fmt.Sprintf("%s left %d node(s) owned by its live session after the elector's Close", p.id, n))
		}
	}
}

// leader returns the live term with the highest token: reported elected,
// its context not ended, its process neither killed, frozen nor exited.
func (l *lane) leader() *termInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaderLocked()
}

func (l *lane) leaderLocked() *termInfo {
	var best *termInfo
	for _, t := range l.terms {
		if t.ctxEnd != 0 || t.workEnd != 0 || t.p.killedAt != 0 || t.p.exitAt != 0 || t.p.frozen {
			continue
		}
		if best == nil || t.token > best.token {
			best = t
		}
	}
	return best
}

// awaitWritingLeader waits until the lane has a live leader whose write
// the register accepted.
func (l *lane) awaitWritingLeader(timeout time.Duration) (*termInfo, error) {
	deadline := time.Now().Add(timeout)
	for {
		ch := l.wait()
		if t := l.leader(); t != nil && l.r.reg.firstAcceptedAtOrAbove(l.key, t.token) != 0 {
			return t, nil
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("lane %d: no leader writing after %v", l.idx, timeout)
			l.diagnose(err.Error())
			return nil, err
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// successor returns the first term elected after old (a larger token), or
// nil.
func (l *lane) successor(old uint64) *termInfo {
	return l.first(func(t *termInfo) bool { return t.token > old })
}

// startedAfter returns the first term other than old that began after
// mono time at, or nil: the successor on a backend whose tokens are not
// authoritative (a Redis restart starts them again at 1).
func (l *lane) startedAfter(at int64, old *termInfo) *termInfo {
	return l.first(func(t *termInfo) bool { return t != old && t.start > at })
}

// first returns the earliest-starting term that match accepts, or nil.
func (l *lane) first(match func(*termInfo) bool) *termInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	var first *termInfo
	for _, t := range l.terms {
		if match(t) && (first == nil || t.start < first.start) {
			first = t
		}
	}
	return first
}

// heldBy reports whether the servers show the entry of term tok holding
// key.
func heldBy(srv servers, key string, tok uint64) bool {
	h, err := srv.Holder(key)
	return err == nil && h == tok
}

// alive reports whether term t still runs.
func (l *lane) alive(t *termInfo) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.ctxEnd == 0 && t.workEnd == 0 && t.p.killedAt == 0 && t.p.exitAt == 0
}

// freezeBeforeWrite asks p, a leader, to stop itself (SIGSTOP) between its
// context check and its next write, and waits until the kernel shows it
// stopped; the stop is recorded then.
func (p *proc) freezeBeforeWrite(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return err
		}
		// "pid (comm) state ...": the state follows the last ')'.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't') {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not stop itself within %v of SIGUSR1", p.id, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	l := p.s.l
	l.mu.Lock()
	p.stops = append(p.stops, mono())
	p.frozen = true
	l.notify()
	l.mu.Unlock()
	return nil
}

func (p *proc) signal(sig syscall.Signal) error {
	l := p.s.l
	l.mu.Lock()
	now := mono()
	switch sig {
	case syscall.SIGKILL:
		p.killedAt = now
	case syscall.SIGQUIT:
		p.quitAt = now
	case syscall.SIGSTOP:
		p.stops = append(p.stops, now)
		p.frozen = true
	case syscall.SIGCONT:
		p.frozen = false
		p.conts = append(p.conts, now)
	}
	l.notify()
	l.mu.Unlock()
	return p.cmd.Process.Signal(sig)
}

// observe waits, after a fault injected at `at` into the lane whose
// leader held old, for the next term, and records the failover; it checks
// invariant 3: a successor within bound, unless the old term is still
// alive and the scenario lets it keep its term.
func (l *lane) observe(at int64, old *termInfo, bound time.Duration, mayKeep bool) (faultRec, []violation) {
	f := faultRec{at: at, old: old.token, bound: bound}
	changes := l.r.srv.LeaderChanges()
	extend := func() {
		if !f.serverLeader && l.r.srv.LeaderChanges() > changes {
			f.serverLeader = true
			bound += l.r.ttl + l.r.srv.ServerFailover()
			f.bound = bound
		}
	}
	var deadline time.Time // bound + 3 s after the fault: report how late, not just "late"
	for {
		ch := l.wait()
		extend()
		deadline = time.Now().Add(time.Duration(at-mono()) + bound + 3*time.Second)
		var s *termInfo
		if l.r.be.linearizable {
			s = l.successor(old.token)
		} else {
			s = l.startedAfter(at, old)
		}
		if s != nil {
			f.failover = time.Duration(s.start - at)
			l.mu.Lock()
			l.faults = append(l.faults, f)
			l.mu.Unlock()
			if f.failover > bound {
				return f, []violation{{inv: livenessInvariant, what: fmt.Sprintf("lane %d: term %d elected %v after the fault, bound %v (server leader changed: %v)", l.idx, s.token, f.failover.Round(time.Millisecond), bound, f.serverLeader)}}
			}
			return f, nil
		}
		elapsed := time.Duration(mono() - at)
		// A term kept must be kept on the server too: a leader that
		// believes it leads while its entry is gone is a stall.
		if mayKeep && elapsed > bound && l.alive(old) && heldBy(l.r.srv, l.key, old.token) {
			f.kept = true
			l.mu.Lock()
			l.faults = append(l.faults, f)
			l.mu.Unlock()
			return f, nil
		}
		if time.Now().After(deadline) {
			l.mu.Lock()
			l.faults = append(l.faults, f)
			l.mu.Unlock()
			v := violation{inv: livenessInvariant, what: fmt.Sprintf("lane %d: no leader after term %d within %v of the fault", l.idx, old.token, elapsed.Round(time.Millisecond))}
			l.diagnose(v.what)
			return f, []violation{v}
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// diagnose logs what the servers hold for a lane that has no leader, and
// the recent log (SIGUSR2) and goroutines (SIGQUIT makes a Go process dump
// them to stderr and exit) of its live candidates, then starts new
// candidates in their slots.
func (l *lane) diagnose(why string) {
	r := l.r
	r.logf("lane %d (%s): %s; %s", l.idx, l.key, why, r.srv.Diagnose(l.key))
	for _, s := range l.slots {
		p := s.proc
		l.mu.Lock()
		gone := p.killedAt != 0 || p.exitAt != 0
		l.mu.Unlock()
		if gone {
			continue
		}
		r.logf("lane %d: the recent log and the goroutines of %s follow on stderr", l.idx, p.id)
		_ = p.signal(syscall.SIGCONT)
		_ = p.signal(syscall.SIGUSR2) // its log (debuglog_test.go)
		time.Sleep(200 * time.Millisecond)
		_ = p.signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.signal(syscall.SIGKILL)
			<-p.exited
		}
		if err := s.spawn(); err != nil {
			r.fail("lane %d: respawn: %v", l.idx, err)
		}
	}
}
