package pgserver

import "syscall"

// sysProcAttr makes the kernel SIGKILL initdb or the server when the thread
// that started it dies, that is when the test process exits (Go keeps its
// threads for the life of the process, unless a goroutine exits while locked
// to its thread); the server's own children, the backends, notice that their
// postmaster is gone and exit too. Its own process group keeps a terminal's
// Ctrl-C to the test process only: the server dies with the test process,
// not before it. A non-nil cred runs the process as that user (Go sets the
// parent-death signal after switching user, which would otherwise clear it).
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true, Credential: cred}
}
