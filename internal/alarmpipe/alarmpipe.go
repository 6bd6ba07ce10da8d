// Package alarmpipe is the reading end of a dead man's switch: a process
// (tenure exec's guard, patroni-like's watchdog) that reads orders from a
// pipe whose only writer is the process it guards, and acts when an
// instant the writer set passes, or when the writer dies (the pipe closes).
//
// Instants are nanoseconds on CLOCK_MONOTONIC, which every process of the
// machine reads alike, and which Go's monotonic time reads too: a change of
// the wall clock moves none of them.
//
// A line written before the instant passed counts, even when the reader
// reads it later (it was slow to start, or starved): Serve fires only when
// the instant has passed and the pipe holds nothing unread.
package alarmpipe

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Now returns the current instant on CLOCK_MONOTONIC, in nanoseconds.
func Now() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// At returns t, a time read in this process, as an instant on
// CLOCK_MONOTONIC.
func At(t time.Time) int64 { return Now() + int64(time.Until(t)) }

// Alarm is the instant Serve fires at; the zero Alarm is not set. It is
// used by Serve's goroutine only.
type Alarm struct {
	at  int64
	set bool
}

// Set makes the alarm fire at at (see At), replacing any earlier setting.
func (a *Alarm) Set(at int64) { a.at, a.set = at, true }

// Clear unsets the alarm.
func (a *Alarm) Clear() { a.set = false }

// IsSet reports whether the alarm is set.
func (a *Alarm) IsSet() bool { return a.set }

// Serve reads newline-terminated lines from fd, a blocking pipe, and
// passes each, without its newline, to line, with the alarm; line returns
// false to end Serve. When the alarm's instant passes with nothing unread,
// Serve clears the alarm and calls fire. It returns eof true when the
// pipe's writers have all closed it (a process that held it died), false
// when line ended it; or an error when fd cannot be polled or read (it is
// not a pipe). Serve does not close fd.
func Serve(fd int, line func(l string, a *Alarm) bool, fire func()) (eof bool, err error) {
	var a Alarm
	var pending []byte
	chunk := make([]byte, 4096)
	for {
		timeout := -1 // no alarm: wait for the next line
		if a.set {
			timeout = int(max(0, (a.at-Now()+int64(time.Millisecond)-1)/int64(time.Millisecond)))
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, err
		}
		if n == 0 { // nothing unread
			if a.set && Now() >= a.at {
				a.Clear()
				fire()
			}
			continue
		}
		k, err := unix.Read(fd, chunk)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return false, err
		}
		if k == 0 {
			return true, nil
		}
		pending = append(pending, chunk[:k]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			l := string(pending[:i])
			pending = pending[i+1:]
			if !line(l, &a) {
				return false, nil
			}
		}
	}
}

// Start runs this very binary (/proc/self/exe: the running version, even
// if its file was replaced or deleted since) with args and env (nil: this
// process's), in a session of its own (a signal to the caller's group or
// terminal does not reach it), its stdin the read end of a new pipe. It
// returns the started process and the pipe's write end, which only the
// caller holds (close-on-exec): when the caller dies, the child reads EOF.
func Start(args, env []string) (*exec.Cmd, *os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Stdin = r
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	return cmd, w, nil
}

// Every calls f at once and then every period, in a goroutine of its own,
// until f returns false or stop is called. stop waits for that goroutine
// to end; it is safe to call more than once, from any goroutine.
func Every(period time.Duration, f func() bool) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for f() {
			select {
			case <-t.C:
			case <-quit:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}
