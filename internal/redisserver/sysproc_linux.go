package redisserver

import "syscall"

// sysProcAttr makes the kernel SIGKILL a server when the thread that started
// it dies, that is when the test process exits (Go keeps its threads for the
// life of the process, unless a goroutine exits while locked to its thread).
// Its own process group keeps a terminal's Ctrl-C to the test process only:
// the server dies with the test process, not before it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
