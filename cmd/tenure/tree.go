package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// CMD's processes are more than its process group: a program that makes a
// group of its own (GNU timeout, a shell with job control, a daemon's
// setsid) leaves the group, and a signal to the group misses it and what
// it starts. tenure therefore also finds CMD's processes by descent (see
// cmdTree), and the guard, once tenure is gone and the tree with it, kills
// every process of CMD's session (CMD starts one: only a process that
// calls setsid itself leaves it) and every process whose environment
// holds the run's TENURE_ variables (see startGuard).

// procStat is what tenure reads of a process in /proc/PID/stat.
type procStat struct {
	pid, ppid, pgid, sid int
	start                uint64 // clock ticks after boot: with pid, names one process
	dead                 bool   // a zombie: exited, not yet reaped
}

// readProcStat parses /proc/PID/stat: "pid (comm) state ppid pgrp session
// ... starttime ...", where comm may hold spaces and parentheses.
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
	// f[0] is field 3 of proc(5) (state); starttime is field 22.
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, false
	}
	p := procStat{pid: pid, dead: f[0][0] == 'Z' || f[0][0] == 'X'}
	var e1, e2, e3, e4 error
	p.ppid, e1 = strconv.Atoi(string(f[1]))
	p.pgid, e2 = strconv.Atoi(string(f[2]))
	p.sid, e3 = strconv.Atoi(string(f[3]))
	p.start, e4 = strconv.ParseUint(string(f[19]), 10, 64)
	return p, e1 == nil && e2 == nil && e3 == nil && e4 == nil
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

// procIsOurs reports whether /proc shows tenure under its own pid. It does
// not in a pid namespace whose /proc is another namespace's: pids would
// name other processes there, and tenure signals CMD's group alone.
var procIsOurs = sync.OnceValue(func() bool {
	l, err := os.Readlink("/proc/self")
	return err == nil && l == strconv.Itoa(os.Getpid())
})

// childFiles reports whether the kernel lists each task's children in
// /proc/PID/task/TID/children, which lets cmdTree read CMD's tree alone
// instead of every process on the machine.
var childFiles = sync.OnceValue(func() bool {
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children")
	return err == nil
})

// childrenOf returns pid's children, from the children files of its tasks.
func childrenOf(pid int) []int { return childrenIn("/proc/" + strconv.Itoa(pid)) }

// childrenIn returns the children of the process whose /proc directory is
// proc ("/proc/self" for tenure, right in any pid namespace).
func childrenIn(proc string) []int {
	dir := proc + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(dir + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// cmdTree finds CMD's processes: CMD and what descends from it, and what
// CMD's processes left behind, which the kernel gives to tenure (its
// subreaper, see supervise), with what descends from them. An adopted
// process is CMD's when it is in CMD's session, or started after CMD in a
// session of its own making (setsid: a daemon's double fork, Python's
// start_new_session). It is not CMD's when it is in tenure's own session
// (CMD's processes cannot join it: the orphans of a child tenure had
// before CMD started, which its shell forked before it exec'd tenure,
// `exec tenure exec ... 2> >(logger)`), nor when it is such a child
// itself, nor the guard. Without cgroups, ancestry is lost once a process
// is adopted: a process that such an earlier child starts after CMD, in a
// session of its own (setsid), and leaves behind is taken for CMD's, and
// stopped with it. Safe for concurrent use once made (it is read only).
type cmdTree struct {
	cmd    procStat         // CMD itself, as it started; its pid is its group's and its session's
	guard  procStat         // the guard (zero when none)
	self   procStat         // tenure
	before map[int]procStat // tenure's children when CMD was about to start
}

// newCmdTree starts describing CMD's processes; call it just before CMD
// starts, and set cmd (and guard) once they have.
func newCmdTree() *cmdTree {
	t := &cmdTree{before: map[int]procStat{}}
	if !procIsOurs() {
		return t
	}
	t.self, _ = readProcStat(os.Getpid())
	for _, p := range readProcs() {
		if p.ppid == os.Getpid() {
			t.before[p.pid] = p
		}
	}
	return t
}

// adopted reports whether c, a child of tenure other than CMD, is CMD's.
func (t *cmdTree) adopted(c procStat) bool {
	switch {
	case is(c, t.guard):
		return false
	case c.sid == t.cmd.pid:
		return true
	case c.sid == t.self.sid, c.start < t.cmd.start:
		return false
	}
	if b, ok := t.before[c.pid]; ok && is(c, b) {
		return false
	}
	return true
}

// is reports whether the process p is the one that want was (same pid,
// same start).
func is(p, want procStat) bool { return want.pid != 0 && p.pid == want.pid && p.start == want.start }

// processes returns CMD's live processes (CMD included while it runs),
// found by descent, and, as orphans, those of them that tenure adopted
// (their parent exited).
func (t *cmdTree) processes() (all, orphans []procStat) {
	if !procIsOurs() {
		return nil, nil
	}
	self := os.Getpid()
	var kids func(pid int) []procStat
	if childFiles() {
		kids = func(pid int) []procStat {
			var out []procStat
			for _, c := range childrenOf(pid) {
				if p, ok := readProcStat(c); ok {
					out = append(out, p)
				}
			}
			return out
		}
	} else {
		byParent := map[int][]procStat{}
		for _, p := range readProcs() {
			byParent[p.ppid] = append(byParent[p.ppid], p)
		}
		kids = func(pid int) []procStat { return byParent[pid] }
	}
	var queue []procStat
	for _, c := range kids(self) {
		switch {
		case is(c, t.cmd):
			queue = append(queue, c)
		case t.adopted(c):
			queue = append(queue, c)
			if !c.dead {
				orphans = append(orphans, c)
			}
		}
	}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if !p.dead {
			all = append(all, p)
		}
		queue = append(queue, kids(p.pid)...)
	}
	return all, orphans
}

// members returns the live processes of CMD's session, from a scan of
// all of /proc: unlike the walk by descent, which reads each parent's list
// of children while processes die, it misses nothing that lives
// throughout.
func (t *cmdTree) members() []procStat {
	if !procIsOurs() {
		return nil
	}
	var out []procStat
	for _, p := range readProcs() {
		if p.sid == t.cmd.pid && !p.dead {
			out = append(out, p)
		}
	}
	return out
}

// signal sends s to CMD's process group, and then: SIGKILL to every other
// process of CMD's (by descent, and in its session); any other signal
// (SIGTERM, a request) only to the orphans outside the group, for a
// process whose parent lives is its parent's to stop (a signal to both
// would reach it twice: GNU timeout, or a tenure exec inside CMD, passes
// it on).
func (t *cmdTree) signal(s syscall.Signal) {
	_ = syscall.Kill(-t.cmd.pid, s)
	all, orphans := t.processes()
	if s != syscall.SIGKILL {
		all = orphans
	}
	kill := func(ps []procStat) {
		for _, p := range ps {
			if p.pgid != t.cmd.pid {
				_ = syscall.Kill(p.pid, s)
			}
		}
	}
	kill(all)
	if s == syscall.SIGKILL {
		kill(t.members()) // after the walk's: the scan reads all of /proc
	}
}

// gone reports whether nothing of CMD's is left: its group is empty, no
// process of its session lives, and none is found by descent.
func (t *cmdTree) gone() bool {
	if syscall.Kill(-t.cmd.pid, 0) == nil {
		return false
	}
	if all, _ := t.processes(); len(all) > 0 {
		return false
	}
	return len(t.members()) == 0 // last: it reads all of /proc
}

// killSession SIGKILLs the process group pgid and every process of the
// session sid, until none is left or after a few rounds (a process that
// forks as it dies). The guard's last act: tenure is gone, and with it the
// tree CMD's processes hung from.
func killSession(pgid, sid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if !procIsOurs() {
		return
	}
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
