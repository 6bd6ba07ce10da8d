package main

import (
	"bytes"
	"errors"
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

	"golang.org/x/sys/unix"
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
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("/proc/self/exe", watchdogCommand)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	return &watchdog{w: w, proc: cmd}, nil
}

// arm tells the watchdog to kill the postmaster pm (see killPostmaster) at
// at, unless a later arm or a disarm comes first.
func (d *watchdog) arm(pm int, at time.Time) error {
	return d.send(fmt.Sprintf("arm %d %d", pm, monoNow()+int64(time.Until(at))))
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
	fd := int(os.Stdin.Fd())
	pm := 0      // armed when > 1
	var at int64 // the kill instant, while armed
	var pending []byte
	chunk := make([]byte, 4096)
	for {
		timeout := -1 // disarmed: wait for the next line
		if pm > 1 {
			timeout = int(max(0, (at-monoNow()+int64(time.Millisecond)-1)/int64(time.Millisecond)))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 1
		}
		if n == 0 { // nothing unread
			if pm > 1 && monoNow() >= at {
				killPostmaster(pm)
				pm = 0
			}
			continue
		}
		k, err := unix.Read(fd, chunk)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if k <= 0 { // the pipe closed (the manager died), or stdin is not the pipe
			if err == nil && pm > 1 {
				killPostmaster(pm)
			}
			return 0
		}
		pending = append(pending, chunk[:k]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			f := strings.Fields(string(pending[:i]))
			pending = pending[i+1:]
			switch {
			case len(f) == 1 && f[0] == "exit":
				return 0
			case len(f) == 1 && f[0] == "disarm":
				pm = 0
			case len(f) == 3 && f[0] == "arm":
				g, err1 := strconv.Atoi(f[1])
				a, err2 := strconv.ParseInt(f[2], 10, 64)
				if err1 == nil && err2 == nil && g > 1 {
					pm, at = g, a
				}
			}
		}
	}
}

// monoNow reads CLOCK_MONOTONIC, in nanoseconds.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
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
