package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

// guardCommand is the hidden subcommand of the guard process that tenure
// exec starts beside CMD.
const guardCommand = "__guard"

// startGuard starts a guard for CMD's session, whose id is also that of
// its process group, pgid (CMD's pid). The kernel kills CMD itself when
// tenure dies (its parent-death signal), but not the processes CMD
// started, which would keep working without the lock while another holder
// starts. The guard holds the read end of a pipe whose write end only
// tenure has: when tenure dies, however it dies, the pipe closes and the
// guard kills the group and the session (see killSession). done tells the
// guard that tenure is finished with them (nothing is killed) and waits
// for it to exit; call it once. pid is the guard's.
func startGuard(pgid int) (pid int, done func(), err error) {
	// This very binary, even if its file was replaced or deleted since
	// (an upgrade while tenure runs): the guard must be this version.
	exe := "/proc/self/exe"
	r, w, err := os.Pipe() // close-on-exec: CMD never holds the write end
	if err != nil {
		return 0, nil, err
	}
	g := exec.Command(exe, guardCommand, strconv.Itoa(pgid))
	g.Stdin = r
	// Its own session: a Ctrl-C to the terminal's group does not reach
	// it, nor does the guard of an enclosing tenure exec, which kills the
	// session this tenure runs in, before this guard has killed CMD's.
	g.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = g.Start()
	r.Close()
	if err != nil {
		w.Close()
		return 0, nil, err
	}
	return g.Process.Pid, func() {
		_, _ = w.Write([]byte{1})
		w.Close()
		_ = g.Wait()
	}, nil
}

// cmdGuard runs the guard: it waits on stdin, and when the pipe closes
// without tenure's byte, SIGKILLs the process group in args[0] and every
// process of the session of that id.
func cmdGuard(args []string, stderr io.Writer) int {
	// Signals meant for tenure or the terminal are not the guard's: only
	// the pipe tells it what to do.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if len(args) != 1 {
		fmt.Fprintln(stderr, "tenure: internal command")
		return exitUsage
	}
	pgid, err := strconv.Atoi(args[0])
	if err != nil || pgid <= 1 {
		fmt.Fprintln(stderr, "tenure: internal command")
		return exitUsage
	}
	var b [1]byte
	if n, err := os.Stdin.Read(b[:]); n == 1 || (err != nil && !errors.Is(err, io.EOF)) {
		return exitOK // tenure is done with the group (or stdin is not the pipe)
	}
	killSession(pgid, pgid)
	return exitOK
}
