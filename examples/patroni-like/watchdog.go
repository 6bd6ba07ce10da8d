package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/internal/alarmpipe"
)

// watchdogCommand is the hidden first argument that runs the watchdog
// process (see watchdog).
const watchdogCommand = "__watchdog"

// watchdog is the manager's end of its watchdog process. While this member
// leads, the manager keeps telling it an instant shortly after the lease
// deadline (see Manager.backstop); if the manager stops telling it (it was
// stopped by SIGSTOP or a debugger, or starved) while PostgreSQL, in a
// process group of its own, runs on and accepts commits, the watchdog
// SIGKILLs the postmaster and every process it forked at that instant,
// before the server can expire the lease and another member can be
// promoted. It does the
// same at once when the manager dies while it is armed. Patroni uses the
// kernel's watchdog device for this, which resets the whole machine; this
// one kills PostgreSQL only, and a machine or VM paused as a whole pauses
// it too.
//
// Its methods are safe for concurrent use; a nil *watchdog does nothing.
type watchdog struct {
	mu   sync.Mutex
	w    *os.File // the pipe's write end: only the manager has it
	proc *exec.Cmd
	err  error // the first failed write: the watchdog is gone
}

// startWatchdog starts the watchdog process: this very binary, in a
// session of its own (a signal to the manager's group does not reach it),
// reading its orders from a pipe.
func startWatchdog() (*watchdog, error) {
	cmd, w, err := alarmpipe.Start([]string{watchdogCommand}, nil)
	if err != nil {
		return nil, err
	}
	return &watchdog{w: w, proc: cmd}, nil
}

// arm tells the watchdog to kill the postmaster pm (see killPostmaster) at
// at, unless a later arm or a disarm comes first.
func (d *watchdog) arm(pm int, at time.Time) error {
	return d.send(fmt.Sprintf("arm %d %d", pm, alarmpipe.At(at)))
}

// disarm tells the watchdog to kill nothing until it is armed again.
func (d *watchdog) disarm() error { return d.send("disarm") }

func (d *watchdog) send(line string) error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err == nil {
		_, d.err = io.WriteString(d.w, line+"\n")
	}
	return d.err
}

// close disarms the watchdog, ends it and waits for it to exit.
func (d *watchdog) close() {
	if d == nil {
		return
	}
	_ = d.send("exit")
	d.mu.Lock()
	d.w.Close()
	d.err = os.ErrClosed
	d.mu.Unlock()
	_ = d.proc.Wait()
}

// runWatchdog is the watchdog process. It reads lines from its stdin, the
// manager's pipe: "arm PID N" (kill postmaster PID at N nanoseconds on
// CLOCK_MONOTONIC, the clock Go's monotonic time reads), "disarm" and
// "exit". When the pipe closes without "exit" (the manager died), it kills
// an armed postmaster at once. A line written before the instant passed
// counts, even if the watchdog reads it later (it was slow to start, or
// starved): it kills only when the instant has passed and the pipe holds
// nothing unread. It returns the exit status.
func runWatchdog(args []string, stderr io.Writer) int {
	// Signals meant for the manager or the terminal are not its own.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if len(args) != 0 {
		fmt.Fprintln(stderr, "patroni-like: internal command")
		return 2
	}
	pm := 0 // armed when > 1
	kill := func() {
		if pm > 1 {
			killPostmaster(pm)
			pm = 0
		}
	}
	eof, err := alarmpipe.Serve(int(os.Stdin.Fd()), func(line string, a *alarmpipe.Alarm) bool {
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == "exit":
			return false
		case len(f) == 1 && f[0] == "disarm":
			pm = 0
			a.Clear()
		case len(f) == 3 && f[0] == "arm":
			g, err1 := strconv.Atoi(f[1])
			at, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil && g > 1 {
				pm = g
				a.Set(at)
			}
		}
		return true
	}, kill)
	if err != nil {
		return 1 // stdin is not the pipe
	}
	if eof { // the manager died
		kill()
	}
	return 0
}

// killPostmaster SIGKILLs the postmaster pm and every process it forked.
// PostgreSQL's backends each run in a session of their own (setsid), so a
// signal to pm's process group reaches pm alone, and a backend outlives
// it until it next waits: long enough to acknowledge a commit in flight.
// pm is stopped first, so that it forks nothing meanwhile. A pid that no
// longer runs postgres (it exited, and the pid was reused) is left alone.
func killPostmaster(pm int) {
	if !strings.Contains(cmdline(pm), "postgres") {
		return
	}
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	kids, _ := children(pm)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = syscall.Kill(-pm, syscall.SIGKILL)
	_ = syscall.Kill(pm, syscall.SIGKILL)
}
