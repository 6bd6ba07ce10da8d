package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/internal/alarmpipe"
)

// guardCommand is the hidden subcommand of the guard process that tenure
// exec starts beside CMD.
const guardCommand = "__guard"

// guard is tenure's end of a running guard process.
type guard struct {
	w    *os.File // the pipe's write end: only tenure has it
	proc *exec.Cmd
	once sync.Once
}

// startGuard starts a guard process, before CMD: the kernel kills CMD
// itself when tenure dies (its parent-death signal), but not the processes
// CMD started, which would keep working without the lock while another
// holder starts. The guard holds the read end of a pipe whose write end
// only tenure has. Once CMD runs, watch tells the guard CMD's session id
// (also its process group's, CMD's pid); when tenure dies, however it
// dies, the pipe closes and the guard kills the group and the session (see
// killSession), and every process whose environment holds all of marks
// (see killMarked). done tells the guard that tenure is finished with
// them (nothing is killed) and waits for it to exit.
//
// marks are the variables that tenure exec adds to CMD's environment
// ("TENURE_TERM=7", "TENURE_KEY=...", ...): together they name this run
// alone (a term is never given twice for a key on one backend), and the
// processes CMD starts inherit them. They cover what the session does not:
// a process that left CMD's session (setsid), and the moment between
// CMD's start and watch's one write to the pipe, when the guard does not
// know the session yet.
//
// The guard starts before CMD, not after: starting it (a fork and an exec
// of this binary, milliseconds on a busy host) after CMD left a window in
// which CMD had started children but no guard was there to kill them if
// tenure died.
func startGuard(marks []string) (*guard, error) {
	for _, m := range marks {
		if !strings.Contains(m, "=") {
			return nil, fmt.Errorf("guard: mark %q is not NAME=VALUE", m)
		}
	}
	// Without the variables that mark a command's processes: this tenure
	// may run inside another tenure exec's command, and that exec's guard
	// must not kill this guard with the command's processes. In a session
	// of its own: a Ctrl-C to the terminal's group does not reach it, nor
	// does the guard of an enclosing tenure exec, which kills the session
	// this tenure runs in, before this guard has killed CMD's. This very
	// binary: the guard must be this version.
	g, w, err := alarmpipe.Start(append([]string{guardCommand}, marks...), withoutMarks(os.Environ(), marks))
	if err != nil {
		return nil, err
	}
	return &guard{w: w, proc: g}, nil
}

// withoutMarks returns env without the variables that marks set.
func withoutMarks(env, marks []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(marks, func(m string) bool { return strings.HasPrefix(m, name+"=") }) {
			out = append(out, kv)
		}
	}
	return out
}

// watch tells the guard the session (and process group) to kill if
// tenure dies: CMD's, pgid.
func (g *guard) watch(pgid int) error {
	_, err := fmt.Fprintf(g.w, "%d\n", pgid)
	return err
}

// killBy tells the guard to SIGKILL CMD's processes (as if tenure had
// died) at at, unless a later instant or done comes first: the backstop
// for a tenure that cannot run at its own deadline (stopped by SIGSTOP, a
// debugger, starved) while CMD, in a session of its own, runs on. The
// guard reads the instant off CLOCK_MONOTONIC, as Go's monotonic clock
// does, so a change of the wall clock moves neither.
func (g *guard) killBy(at time.Time) error {
	_, err := fmt.Fprintf(g.w, "%s %d\n", guardKillAtLine, alarmpipe.At(at))
	return err
}

// guardKillAtLine starts the line that sets the guard's kill instant.
const guardKillAtLine = "kill-at"

// done tells the guard to exit without killing anything and waits for it.
// Safe to call more than once; only the first call acts.
func (g *guard) done() {
	g.once.Do(func() {
		_, _ = g.w.Write([]byte(guardDoneLine + "\n"))
		g.w.Close()
		_ = g.proc.Wait()
	})
}

// guardDoneLine is the line that tells the guard tenure is finished.
const guardDoneLine = "done"

// cmdGuard runs the guard: it reads its stdin, the pipe from tenure. A
// line with a number names the session (and process group) it guards; a
// line "kill-at N" sets the instant, N nanoseconds on CLOCK_MONOTONIC, at
// which it kills them (the last such line counts); a line "done" ends it,
// killing nothing. When the pipe closes without "done" (tenure died), or
// the kill instant passes first, it SIGKILLs the process group and every
// process of the session it was told of, if any, and every process whose
// environment holds all of args, the marks (see startGuard).
func cmdGuard(args []string, stderr io.Writer) int {
	// Signals meant for tenure or the terminal are not the guard's: only
	// the pipe tells it what to do.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	for _, m := range args {
		if !strings.Contains(m, "=") {
			fmt.Fprintln(stderr, "tenure: internal command")
			return exitUsage
		}
	}
	pgid := 0
	kill := func() {
		if pgid > 1 {
			killSession(pgid, pgid)
		}
		killMarked(args)
	}
	// The kill instant counts only if no line written before it passed
	// is still unread (see alarmpipe).
	eof, err := alarmpipe.Serve(int(os.Stdin.Fd()), func(line string, a *alarmpipe.Alarm) bool {
		switch {
		case line == guardDoneLine:
			return false
		case strings.HasPrefix(line, guardKillAtLine+" "):
			if at, err := strconv.ParseInt(strings.TrimPrefix(line, guardKillAtLine+" "), 10, 64); err == nil {
				a.Set(at)
			}
		default:
			if n, err := strconv.Atoi(line); err == nil && n > 1 {
				pgid = n
			}
		}
		return true
	}, kill)
	if err != nil {
		return exitFailure // stdin is not the pipe
	}
	if eof { // tenure died (before CMD started: nothing is found)
		kill()
	}
	return exitOK
}

// killMarked SIGKILLs every process (but the guard) whose environment, as
// /proc/PID/environ shows it, holds every entry of marks, and reads /proc
// again until two reads markedQuiet apart find none left, or for at most
// 50 rounds: a process may fork while it reads, and one in the middle of
// an exec (a shell's "exec sleep") shows no environment for that moment.
// It kills nothing when marks is empty, or when /proc is not this pid
// namespace's. A process that set up its environment anew (env -i) is not
// found, nor one of another user.
func killMarked(marks []string) {
	if len(marks) == 0 || !procIsOurs() {
		return
	}
	self := os.Getpid()
	quiet := 0
	for range 50 {
		n := 0
		for _, p := range readProcs() {
			if p.pid != self && !p.dead && environHolds(p.pid, marks) {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				n++
			}
		}
		if n > 0 {
			quiet = 0
			time.Sleep(time.Millisecond)
			continue
		}
		if quiet++; quiet == 2 {
			return
		}
		time.Sleep(markedQuiet)
	}
}

// markedQuiet is how long killMarked waits before it reads /proc again to
// confirm that no marked process is left.
const markedQuiet = 10 * time.Millisecond

// environHolds reports whether process pid's environment has every entry
// of marks. False when it cannot be read.
func environHolds(pid int, marks []string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil || len(b) == 0 {
		return false
	}
	env := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	for _, m := range marks {
		if !slices.Contains(env, m) {
			return false
		}
	}
	return true
}
