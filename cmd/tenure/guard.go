package main

import (
	"bufio"
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
// killSession). done tells the guard that tenure is finished with them
// (nothing is killed) and waits for it to exit.
//
// The guard starts before CMD, not after: starting it (a fork and an exec
// of this binary, milliseconds on a busy host) after CMD left a window in
// which CMD had started children but no guard was there to kill them if
// tenure died. What remains is the moment between CMD's start and watch's
// one write to the pipe.
func startGuard() (*guard, error) {
	// This very binary, even if its file was replaced or deleted since
	// (an upgrade while tenure runs): the guard must be this version.
	exe := "/proc/self/exe"
	r, w, err := os.Pipe() // close-on-exec: CMD never holds the write end
	if err != nil {
		return nil, err
	}
	g := exec.Command(exe, guardCommand)
	g.Stdin = r
	// Its own session: a Ctrl-C to the terminal's group does not reach
	// it, nor does the guard of an enclosing tenure exec, which kills the
	// session this tenure runs in, before this guard has killed CMD's.
	g.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = g.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	return &guard{w: w, proc: g}, nil
}

// watch tells the guard the session (and process group) to kill if
// tenure dies: CMD's, pgid.
func (g *guard) watch(pgid int) error {
	_, err := fmt.Fprintf(g.w, "%d\n", pgid)
	return err
}

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
// line "done" ends it, killing nothing. When the pipe closes without
// "done" (tenure died), it SIGKILLs the process group and every process of
// the session it was told of, if any.
func cmdGuard(args []string, stderr io.Writer) int {
	// Signals meant for tenure or the terminal are not the guard's: only
	// the pipe tells it what to do.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if len(args) != 0 {
		fmt.Fprintln(stderr, "tenure: internal command")
		return exitUsage
	}
	pgid := 0
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) && pgid > 1 {
				killSession(pgid, pgid)
			}
			return exitOK // tenure died before CMD started, or stdin is not the pipe
		}
		line = strings.TrimSuffix(line, "\n")
		if line == guardDoneLine {
			return exitOK
		}
		if n, err := strconv.Atoi(line); err == nil && n > 1 {
			pgid = n
		}
	}
}
