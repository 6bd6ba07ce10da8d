//go:build !linux

package pgserver

import "syscall"

// sysProcAttr puts initdb or the server in its own process group, running as
// cred's user when cred is not nil. Outside Linux there is no parent-death
// signal: a test process that dies without Close leaves its server running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
