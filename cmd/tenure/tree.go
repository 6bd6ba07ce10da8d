package main

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
	"time"
)

// CMD's processes are more than its process group: a program that makes a
// group of its own (GNU timeout, a shell with job control, a daemon's
// setsid) leaves the group, and a signal to the group misses it and what
// it starts. tenure therefore signals every process descended from it but
// the guard (CMD, and what CMD started: an orphan is reparented to tenure,
// its subreaper, see supervise), and the guard, once tenure is gone and the
// tree with it, every process of CMD's session (CMD starts one: only a
// process that calls setsid itself leaves it).

// procStat is what tenure reads of a process in /proc/PID/stat.
type procStat struct {
	pid, ppid, pgid, sid int
	dead                 bool // a zombie: exited, not yet reaped
}

// readProcs returns every process of /proc. Processes that end while it
// reads are left out.
func readProcs() []procStat {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	procs := make([]procStat, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		if p, ok := readProcStat(pid); ok {
			procs = append(procs, p)
		}
	}
	return procs
}

// readProcStat parses /proc/PID/stat: "pid (comm) state ppid pgrp session
// ...", where comm may hold spaces and parentheses.
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, false
	}
	p := procStat{pid: pid, dead: f[0][0] == 'Z' || f[0][0] == 'X'}
	var e1, e2, e3 error
	p.ppid, e1 = strconv.Atoi(string(f[1]))
	p.pgid, e2 = strconv.Atoi(string(f[2]))
	p.sid, e3 = strconv.Atoi(string(f[3]))
	return p, e1 == nil && e2 == nil && e3 == nil
}

// descendants returns the live processes descended from tenure, except
// the process skip and what descends from it (the guard; 0 for none).
func descendants(skip int) []procStat {
	procs := readProcs()
	children := make(map[int][]int, len(procs))
	byPid := make(map[int]procStat, len(procs))
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		byPid[p.pid] = p
	}
	var out []procStat
	queue := []int{os.Getpid()}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if c == skip {
				continue
			}
			queue = append(queue, c)
			if p := byPid[c]; !p.dead {
				out = append(out, p)
			}
		}
	}
	return out
}

// signalTree sends s to the process group pgid (CMD's), then to every
// other live process descended from tenure but skip (the guard), each
// once. It returns how many processes outside the group it signalled.
func signalTree(pgid, skip int, s syscall.Signal) int {
	_ = syscall.Kill(-pgid, s)
	n := 0
	for _, p := range descendants(skip) {
		if p.pgid != pgid {
			_ = syscall.Kill(p.pid, s)
			n++
		}
	}
	return n
}

// killSession SIGKILLs the process group pgid and every process of the
// session sid, until none is left or after a few rounds (a process that
// forks as it dies). The guard's last act: tenure is gone, and with it the
// tree CMD's processes hung from.
func killSession(pgid, sid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	self := os.Getpid()
	for range 50 {
		n := 0
		for _, p := range readProcs() {
			if p.sid == sid && p.pid != self && !p.dead {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				n++
			}
		}
		if n == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
