//go:build !linux

package redisserver

import "syscall"

// sysProcAttr puts a server in its own process group. Outside Linux there is
// no parent-death signal: a test process that dies without Close leaves its
// servers running.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
