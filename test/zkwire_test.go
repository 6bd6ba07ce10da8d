package test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// The ZooKeeper handoff benchmark splits each timed handoff of the
// in-process implementations (tenure and go-zookeeper's Lock) into its
// parts, from timestamps taken on the wire: every connection a contender
// dials is wrapped by a wireConn that notes, for each frame, when it was
// written or read, its xid and its opcode. A handoff from releaser r to
// acquirer a then reads, in order:
//
//	release  the harness's release → r writes its delete        (client)
//	commit   r writes the delete → a reads the watch event      (server)
//	wake     a reads the event → a writes its next request      (client)
//	read     that request written → its reply read by a         (server)
//
// r's delete is a delete or, when tenure records the handover, a multi;
// a's read is one request or, when it reads a handover record, the
// requests it writes together before the first reply, and ends at the
// last of their replies.
//	elect    the reply read → a's campaign or Lock returns      (client)
//
// "Server" parts include the loopback and the client's own receive loop;
// "client" parts are the library's own code between two frames. Both
// implementations pay the same wrapper (a timestamp and a short parse per
// frame).

// ZooKeeper's create, delete and multi opcodes.
const (
	zkOpCreate = 1
	zkOpDelete = 2
	zkOpMulti  = 14
)

// wireFrame is one frame seen on a connection.
type wireFrame struct {
	at  time.Time
	in  bool  // read from the server
	xid int32 // -1: a watch event, -2: a ping
	op  int32 // requests: the opcode
}

// wireConn notes the frames of one connection. go-zookeeper writes from one
// goroutine and reads from another: each direction has its own parse state,
// and the frames one lock.
type wireConn struct {
	net.Conn
	out, in wireSplit

	mu     sync.Mutex
	frames []wireFrame
}

// wireSplit cuts one direction of a connection into frames: a 4-byte
// big-endian length, then the payload. It keeps the length and the first 8
// payload bytes of the current frame and skips the rest. The first frame
// each way (connect) is not reported.
type wireSplit struct {
	hdr  [12]byte
	n    int // bytes of hdr filled
	size int // the current frame's payload length
	skip int // payload bytes after the first 8 not yet seen
	seen bool
}

// feed takes the bytes b and calls f with the first 8 payload bytes of
// each frame that b completes.
func (s *wireSplit) feed(b []byte, f func(head []byte)) {
	for len(b) > 0 {
		if s.skip > 0 {
			k := min(s.skip, len(b))
			s.skip -= k
			b = b[k:]
			if s.skip == 0 {
				s.done(f)
			}
			continue
		}
		if s.n < 4 {
			k := copy(s.hdr[s.n:4], b)
			s.n += k
			b = b[k:]
			if s.n < 4 {
				continue
			}
			s.size = int(binary.BigEndian.Uint32(s.hdr[:4]))
		}
		want := 4 + min(s.size, 8)
		k := copy(s.hdr[s.n:want], b)
		s.n += k
		b = b[k:]
		if s.n == want {
			s.skip = s.size - (want - 4)
			if s.skip == 0 {
				s.done(f)
			}
		}
	}
}

func (s *wireSplit) done(f func(head []byte)) {
	if s.seen && s.size >= 8 {
		f(s.hdr[4:12])
	}
	s.seen = true
	s.n = 0
}

func (c *wireConn) Write(b []byte) (int, error) {
	now := time.Now()
	c.out.feed(b, func(h []byte) {
		c.note(wireFrame{at: now, xid: int32(binary.BigEndian.Uint32(h)), op: int32(binary.BigEndian.Uint32(h[4:]))})
	})
	return c.Conn.Write(b)
}

func (c *wireConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	now := time.Now()
	c.in.feed(b[:n], func(h []byte) {
		c.note(wireFrame{at: now, in: true, xid: int32(binary.BigEndian.Uint32(h))})
	})
	return n, err
}

func (c *wireConn) note(f wireFrame) {
	c.mu.Lock()
	c.frames = append(c.frames, f)
	c.mu.Unlock()
}

// snapshot returns a copy of the frames seen so far.
func (c *wireConn) snapshot() []wireFrame {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.frames)
}

// wireLog holds the connections of one run's contenders and its timed
// handoffs. It is safe for concurrent use.
type wireLog struct {
	mu       sync.Mutex
	conns    map[int][]*wireConn // by contender
	handoffs []wireHandoff
}

type wireHandoff struct {
	from, to          int
	release, acquired time.Time
}

func newWireLog() *wireLog { return &wireLog{conns: map[int][]*wireConn{}} }

// dialer returns the dialer contender i connects with.
func (w *wireLog) dialer(i int) zk.Dialer {
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		wc := &wireConn{Conn: c}
		w.mu.Lock()
		w.conns[i] = append(w.conns[i], wc)
		w.mu.Unlock()
		return wc, nil
	}
}

// handoff records one timed handoff (handoffLoop.trace).
func (w *wireLog) handoff(from, to int, release, acquired time.Time) {
	w.mu.Lock()
	w.handoffs = append(w.handoffs, wireHandoff{from, to, release, acquired})
	w.mu.Unlock()
}

// framesOf returns contender i's frames, every connection's, in time order.
func (w *wireLog) framesOf(i int) []wireFrame {
	w.mu.Lock()
	conns := slices.Clone(w.conns[i])
	w.mu.Unlock()
	var fs []wireFrame
	for _, c := range conns {
		fs = append(fs, c.snapshot()...)
	}
	slices.SortStableFunc(fs, func(a, b wireFrame) int { return a.at.Compare(b.at) })
	return fs
}

// wireParts is one handoff split on the wire, and, when requeued, the
// time from the releaser's reading its delete's reply to its writing its
// next create (the campaign after the release: not part of the handoff,
// but its create reaches the server while the handoff's read does).
type wireParts struct {
	release, commit, wake, read, elect time.Duration
	requeue                            time.Duration
	requeued                           bool
}

// split finds handoff h's frames; ok is false when one is missing (the
// successor was not waiting on a watch, a connection was replaced).
func split(h wireHandoff, from, to []wireFrame) (p wireParts, ok bool) {
	i, _ := slices.BinarySearchFunc(from, h.release, func(f wireFrame, t time.Time) int { return f.at.Compare(t) })
	var del, delReply time.Time
	delXid := int32(0)
	for _, f := range from[i:] {
		if del.IsZero() {
			if f.at.After(h.acquired) {
				break
			}
			if !f.in && (f.op == zkOpDelete || f.op == zkOpMulti) {
				del, delXid = f.at, f.xid
			}
			continue
		}
		if delReply.IsZero() {
			if f.in && f.xid == delXid {
				delReply = f.at
			}
			continue
		}
		if !f.in && f.op == zkOpCreate {
			p.requeue, p.requeued = f.at.Sub(delReply), true
			break
		}
	}
	if del.IsZero() {
		return p, false
	}
	j, _ := slices.BinarySearchFunc(to, del, func(f wireFrame, t time.Time) int { return f.at.Compare(t) })
	var event, sent, reply time.Time
	pending := map[int32]bool{} // the requests written together after the event, unanswered
	answered := false
	for _, f := range to[j:] {
		if f.at.After(h.acquired) {
			break
		}
		switch {
		case event.IsZero():
			if f.in && f.xid == -1 {
				event = f.at
			}
		case sent.IsZero():
			if !f.in && f.xid >= 0 {
				sent, pending[f.xid] = f.at, true
			}
		case !f.in && f.xid >= 0 && !answered:
			pending[f.xid] = true
		case f.in && pending[f.xid]:
			delete(pending, f.xid)
			answered = true
			if len(pending) == 0 {
				reply = f.at
			}
		}
		if !reply.IsZero() {
			break
		}
	}
	if reply.IsZero() {
		return p, false
	}
	p.release, p.commit, p.wake, p.read, p.elect = del.Sub(h.release), event.Sub(del), sent.Sub(event), reply.Sub(sent), h.acquired.Sub(reply)
	return p, true
}

// report splits every timed handoff and reports the median of each part
// in µs (release-us, commit-us, wake-us, read-us, elect-us), the median of
// the three client parts' sum (client-us), the share of handoffs it
// could split (split), and the median requeue (requeue-us).
//
// Only a handoff whose successor was waiting on its predecessor's watch
// splits. With n contenders the releaser joins the queue n-1 places back;
// at 2, the successor is mostly the last releaser, whose requeue (three
// round trips) is often not done when the holder releases again, so it
// finds itself first without an event and few handoffs split. From 10
// contenders on every successor waits on a watch: report fails b when it
// splits fewer than half of them then (a frame it looks for is no longer
// where it looks).
func (w *wireLog) report(b *testing.B, n int) {
	w.mu.Lock()
	hs := slices.Clone(w.handoffs)
	w.mu.Unlock()
	frames := map[int][]wireFrame{}
	of := func(i int) []wireFrame {
		if fs, ok := frames[i]; ok {
			return fs
		}
		frames[i] = w.framesOf(i)
		return frames[i]
	}
	var parts [6][]time.Duration
	var requeues []time.Duration
	for _, h := range hs {
		p, ok := split(h, of(h.from), of(h.to))
		if !ok {
			continue
		}
		if p.requeued {
			requeues = append(requeues, p.requeue)
		}
		for k, d := range []time.Duration{p.release, p.commit, p.wake, p.read, p.elect, p.release + p.wake + p.elect} {
			parts[k] = append(parts[k], d)
		}
	}
	if n >= 10 && 2*len(parts[0]) < len(hs) {
		b.Errorf("wire split: %d of %d timed handoffs at %d contenders split into their frames", len(parts[0]), len(hs), n)
		return
	}
	if len(parts[0]) == 0 {
		return
	}
	for k, unit := range []string{"release-us", "commit-us", "wake-us", "read-us", "elect-us", "client-us"} {
		slices.Sort(parts[k])
		b.ReportMetric(float64(nearestRank(parts[k], 50))/float64(time.Microsecond), unit)
	}
	b.ReportMetric(float64(len(parts[0]))/float64(len(hs)), "split")
	if len(requeues) > 0 {
		slices.Sort(requeues)
		b.ReportMetric(float64(nearestRank(requeues, 50))/float64(time.Microsecond), "requeue-us")
	}
}

// cpuMeter measures the CPU time the ZooKeeper server and this process
// use over the timed handoffs.
type cpuMeter struct {
	zkPid      int
	zk0, self0 time.Duration
	ok         bool
}

func (m *cpuMeter) begin() {
	m.zkPid = 0
	if zkEnsemble != nil {
		m.zkPid, _ = zkEnsemble.Pid(0)
	}
	zk, err := procCPU(m.zkPid)
	m.zk0, m.self0, m.ok = zk, selfCPU(), err == nil
}

// report reports zk-cpu-us/handoff, the server's CPU time per handoff
// over n handoffs, and with self go-cpu-us/handoff, this process's (every
// in-process contender's and the harness's).
func (m *cpuMeter) report(b *testing.B, n int, self bool) {
	zk, err := procCPU(m.zkPid)
	if !m.ok || err != nil || n == 0 {
		return // no /proc: the figures are left out
	}
	b.ReportMetric(float64(zk-m.zk0)/float64(time.Microsecond)/float64(n), "zk-cpu-us/handoff")
	if self {
		b.ReportMetric(float64(selfCPU()-m.self0)/float64(time.Microsecond)/float64(n), "go-cpu-us/handoff")
	}
}

// procCPU returns the user and system CPU time of process pid, from
// /proc/PID/stat (in clock ticks of 10 ms, Linux's USER_HZ).
func procCPU(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("no pid")
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(st)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+2:]) // from field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// selfCPU returns this process's user and system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestWireSplit_AnyChunking feeds a stream of frames of many sizes (0 to
// 70,000 payload bytes) in random chunks and checks that every frame after
// the first is reported once, in order, with its own first 8 bytes.
func TestWireSplit_AnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		var stream []byte
		var want []uint64
		for k := range 40 {
			size := []int{0, 3, 8, 9, 16, 100, 5000, 70000}[rng.IntN(8)]
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(rng.Uint32())
			}
			stream = binary.BigEndian.AppendUint32(stream, uint32(size))
			stream = append(stream, payload...)
			if k > 0 && size >= 8 {
				want = append(want, binary.BigEndian.Uint64(payload))
			}
		}
		var s wireSplit
		var got []uint64
		for rest := stream; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(20000))
			if rng.IntN(3) == 0 {
				n = min(len(rest), 1+rng.IntN(6))
			}
			s.feed(rest[:n], func(head []byte) { got = append(got, binary.BigEndian.Uint64(head)) })
			rest = rest[n:]
		}
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: reported %d frames %x, want %d %x", trial, len(got), got, len(want), want)
		}
	}
}

// TestSplit_FindsEachPart checks split on hand-made frames: the releaser's
// delete, the successor's event, its next request and that request's
// reply, with a ping and unrelated frames around them; and a handoff
// without an event does not split.
func TestSplit_FindsEachPart(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	from := []wireFrame{
		{at: at(-50), xid: 7, op: zkOpDelete}, // an earlier delete
		{at: at(3), xid: 8, op: 12},           // not a delete
		{at: at(5), xid: 9, op: zkOpDelete},
		{at: at(300), in: true, xid: 9},
		{at: at(310), xid: 10, op: 12},
		{at: at(312), xid: 11, op: zkOpCreate},
		{at: at(320), xid: 12, op: zkOpCreate},
	}
	to := []wireFrame{
		{at: at(1), in: true, xid: -1}, // before the delete: not this handoff's
		{at: at(260), in: true, xid: -2},
		{at: at(280), in: true, xid: -1},
		{at: at(283), xid: -2}, // a ping
		{at: at(290), xid: 31, op: 12},
		{at: at(295), in: true, xid: 30}, // another reply
		{at: at(540), in: true, xid: 31},
	}
	h := wireHandoff{from: 0, to: 1, release: at(0), acquired: at(560)}
	p, ok := split(h, from, to)
	want := wireParts{release: 5 * time.Microsecond, commit: 275 * time.Microsecond, wake: 10 * time.Microsecond, read: 250 * time.Microsecond, elect: 20 * time.Microsecond,
		requeue: 12 * time.Microsecond, requeued: true}
	if !ok || p != want {
		t.Fatalf("split = %+v, %v; want %+v, true", p, ok, want)
	}
	// A release by multi, and a successor that writes two requests
	// together (a handover record's read): the read ends at the later
	// reply; a request written after the first reply is not part of it.
	multiFrom := slices.Clone(from)
	multiFrom[2].op = zkOpMulti
	pair := []wireFrame{
		{at: at(280), in: true, xid: -1},
		{at: at(290), xid: 31, op: 4},
		{at: at(292), xid: 32, op: 3},
		{at: at(500), in: true, xid: 32},
		{at: at(505), xid: 33, op: 12}, // after a reply: not the read's
		{at: at(520), in: true, xid: 31},
		{at: at(530), in: true, xid: 33},
	}
	want.read = 230 * time.Microsecond
	want.elect = 40 * time.Microsecond
	if p, ok := split(h, multiFrom, pair); !ok || p != want {
		t.Fatalf("split (multi, two requests) = %+v, %v; want %+v, true", p, ok, want)
	}
	if _, ok := split(h, from, to[3:]); ok {
		t.Errorf("split found a handoff whose successor read no event")
	}
	if _, ok := split(wireHandoff{release: at(0), acquired: at(4)}, from, to); ok {
		t.Errorf("split found a delete written after the acquisition")
	}
}
