package main

import "syscall"

// reapOrphans reaps tenure's children that have exited, except keep (CMD,
// whose status cmd.Wait collects). tenure is the subreaper of what CMD
// starts (see supervise): a process left behind when its parent exits (a
// shell's `(job &)`, a daemon's double fork) becomes tenure's child, and
// once it exits, a zombie that holds a process table slot until it is
// reaped; over the weeks a server runs under tenure exec they would pile
// up. It is called on every SIGCHLD while CMD runs. The children are read
// from /proc (each thread's children file); where the kernel does not
// provide it, nothing is reaped before CMD exits, when stopGroup reaps
// CMD's group.
func reapOrphans(keep int) {
	for _, pid := range childrenIn("/proc/self") {
		if pid == keep {
			continue
		}
		// Not CMD: an orphan, or the guard (whose Wait, in the guard's
		// done func, ignores its error).
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}
