package zkelect

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// A create's reply carries the zxid of the transaction that made the node,
// which is the node's czxid, tenure's token. go-zookeeper reads it and
// keeps it to itself (v1.0.4 has no create that returns a Stat), so without
// it every Enqueue would read its new node again, one more request per
// handoff on a server that is the bottleneck. The tap reads it off the wire:
// it wraps each connection go-zookeeper dials, follows the frames both ways
// (the requests only far enough to know which xids are creates), and keeps
// the zxid and the ZooKeeper session of each reply to a create of a
// protected node, by the path the server answered. It never changes a byte.
//
// Frames (ZooKeeper's jute encoding, big-endian): a 4-byte length, then
// the payload. The first frame each way is the connect request and its
// response (protocol version, timeout, session id, ...); then a request is
// xid, opcode, body and a reply is xid, zxid, error, body. A create's
// reply body is the node's path, a length-prefixed string.

// tappedNode is what the tap learned of one created node.
type tappedNode struct {
	zxid    int64 // the create's transaction: the node's czxid
	session int64 // the ZooKeeper session the reply came on, the node's owner
}

// maxTapped bounds the nodes the tap keeps for Enqueue to take: a create
// whose Enqueue gave up leaves its entry, and past this many the tap
// forgets them all (Enqueue then reads the node, as without the tap).
const maxTapped = 4096

// tap is shared by every connection of one Backend. It is safe for
// concurrent use.
type tap struct {
	mu    sync.Mutex
	nodes map[string]tappedNode
	off   bool // tests: record nothing, as if no reply could be read

	misses atomic.Uint64 // creates Enqueue had to read back, the tap having no record

	cur atomic.Pointer[tappedConn] // the connection dialled last: go-zookeeper's current one
}

func newTap() *tap { return &tap{nodes: map[string]tappedNode{}} }

// dialer wraps d (net.DialTimeout when nil).
func (t *tap) dialer(d zk.Dialer) zk.Dialer {
	if d == nil {
		d = net.DialTimeout
	}
	return func(network, address string, timeout time.Duration) (net.Conn, error) {
		dialed := time.Now()
		c, err := d(network, address, timeout)
		if err != nil || c == nil {
			return c, err
		}
		tc := &tappedConn{Conn: c, t: t, creates: map[int32]struct{}{}, dialed: dialed}
		tc.out.head = 8           // xid, opcode
		tc.in.head = 16 + 4 + 512 // xid, zxid, error, then a path's length and up to 512 bytes of it
		t.cur.Store(tc)
		return tc, nil
	}
}

// take returns and forgets what the tap learned of the node at p.
func (t *tap) take(p string) (tappedNode, bool) {
	if t == nil {
		return tappedNode{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n, ok := t.nodes[p]
	delete(t.nodes, p)
	return n, ok
}

func (t *tap) put(p string, n tappedNode) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off {
		return
	}
	if len(t.nodes) >= maxTapped {
		clear(t.nodes)
	}
	t.nodes[p] = n
}

// tappedConn is one connection go-zookeeper dialled. go-zookeeper writes
// from one goroutine and reads from another; each direction has its own
// lock, and creates (written by one, read by the other) its own.
type tappedConn struct {
	net.Conn
	t *tap

	outMu sync.Mutex
	out   frames

	rdMu    sync.Mutex // Read's buffer
	rbufMem []byte     // readBufSize bytes, once the first read needs it
	rbuf    []byte     // the bytes of rbufMem the last read of the connection returned
	rd      int        // rbuf[:rd] has been returned

	inMu    sync.Mutex
	in      frames
	session int64

	createsMu sync.Mutex
	creates   map[int32]struct{} // xids of create requests sent and not yet answered

	// What bounds the ZooKeeper leader server's last touch of the session
	// on this connection (see Backend.anchor).
	dialed time.Time    // before the dial, so before the connect request
	role   atomic.Int32 // the server's role, from /zookeeper/config: roleUnknown until read
	ancMu  sync.Mutex
	heard  time.Time  // the latest sync sent that the leader server has surely heard of (zero: none)
	recent []syncMark // syncs answered since, too recent to count from yet
}

// Write notes the creates among the requests before they leave, so that
// their replies, which cannot come sooner, are recognized.
func (c *tappedConn) Write(b []byte) (int, error) {
	c.outMu.Lock()
	c.out.feed(b, c.request)
	c.outMu.Unlock()
	return c.Conn.Write(b)
}

// readBufSize is the read buffer of each connection: a few replies and
// events, or the head of a large children list.
const readBufSize = 16 << 10

// Read serves go-zookeeper's reads from a buffer that one read of the
// connection fills. go-zookeeper reads each frame in two calls (its 4-byte
// length, then its payload), each a system call on a bare connection; from
// the buffer, a frame that arrived whole, and the frames that arrived
// with it, cost one. A read larger than the buffer (the rest of a long
// children list) goes to the connection directly once the buffer is
// drained. The buffer never holds bytes back: Read returns what it has
// before it reads the connection again, so a deadline set for the next
// read applies exactly as on the bare connection (only that a frame
// already received is returned without waiting). go-zookeeper reads from
// one goroutine at a time (the connect, then its receive loop); rdMu
// makes a misuse wait rather than corrupt the buffer.
func (c *tappedConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	c.rdMu.Lock()
	defer c.rdMu.Unlock()
	if c.rd == len(c.rbuf) {
		if len(b) >= readBufSize {
			n, err := c.Conn.Read(b)
			c.fed(b[:n])
			return n, err
		}
		if c.rbufMem == nil {
			c.rbufMem = make([]byte, readBufSize)
		}
		n, err := c.Conn.Read(c.rbufMem)
		c.fed(c.rbufMem[:n])
		c.rbuf, c.rd = c.rbufMem[:n], 0
		if n == 0 {
			return 0, err
		}
		// An error that came with bytes is dropped: a connection's errors
		// other than a timeout stay (the next read of it returns the same),
		// and a timeout must not be returned later, under the deadline
		// go-zookeeper sets for its next frame.
	}
	n := copy(b, c.rbuf[c.rd:])
	c.rd += n
	return n, nil
}

// fed follows the bytes read from the connection.
func (c *tappedConn) fed(b []byte) {
	if len(b) > 0 {
		c.inMu.Lock()
		c.in.feed(b, c.reply)
		c.inMu.Unlock()
	}
}

const (
	opCreate      = 1  // go-zookeeper's Create
	opCreate2     = 15 // a create that answers with a Stat too
	opCreateTTL   = 21
	opCreateCntnr = 19
)

// request handles the head of one request frame.
func (c *tappedConn) request(index int, head []byte) {
	if index == 0 || len(head) < 8 {
		return // the connect request
	}
	switch int32(binary.BigEndian.Uint32(head[4:8])) {
	case opCreate, opCreate2, opCreateTTL, opCreateCntnr:
		c.createsMu.Lock()
		c.creates[int32(binary.BigEndian.Uint32(head[0:4]))] = struct{}{}
		c.createsMu.Unlock()
	}
}

// reply handles the head of one reply frame.
func (c *tappedConn) reply(index int, head []byte) {
	if index == 0 { // the connect response: protocol version, timeout, session id
		if len(head) >= 16 {
			c.session = int64(binary.BigEndian.Uint64(head[8:16]))
		}
		return
	}
	if len(head) < 16 {
		return
	}
	xid := int32(binary.BigEndian.Uint32(head[0:4]))
	if xid < 0 {
		return // a watch event, a ping, an auth or setWatches reply
	}
	c.createsMu.Lock()
	_, create := c.creates[xid]
	delete(c.creates, xid)
	c.createsMu.Unlock()
	if !create || binary.BigEndian.Uint32(head[12:16]) != 0 || len(head) < 20 {
		return // not a create, or one that failed
	}
	n := int(int32(binary.BigEndian.Uint32(head[16:20])))
	if n <= 0 || 20+n > len(head) {
		return // no path, or a longer one than the tap keeps
	}
	p := string(head[20 : 20+n])
	if !strings.Contains(p, "/"+protectedPrefix) || c.session == 0 {
		return
	}
	c.t.put(p, tappedNode{zxid: int64(binary.BigEndian.Uint64(head[4:12])), session: c.session})
}

// frames splits one direction of a connection into frames and hands the
// first bytes of each (up to head bytes) to a handler once the frame is
// complete. It keeps no more than head bytes of any frame.
type frames struct {
	head int // bytes of each frame's payload to keep

	lenBuf [4]byte
	lenN   int    // bytes of the length read so far
	left   int    // payload bytes of the current frame not yet seen
	buf    []byte // the current frame's first bytes
	index  int    // frames completed so far
}

func (f *frames) feed(b []byte, handle func(index int, head []byte)) {
	for len(b) > 0 {
		if f.lenN < 4 {
			k := copy(f.lenBuf[f.lenN:], b)
			f.lenN += k
			b = b[k:]
			if f.lenN < 4 {
				return
			}
			// Unsigned, as go-zookeeper reads it, so that both stay in
			// step on any length.
			f.left = int(binary.BigEndian.Uint32(f.lenBuf[:]))
			f.buf = f.buf[:0]
			if f.left == 0 {
				handle(f.index, nil)
				f.index++
				f.lenN = 0
			}
			continue
		}
		k := min(f.left, len(b))
		if keep := min(f.head-len(f.buf), k); keep > 0 {
			f.buf = append(f.buf, b[:keep]...)
		}
		f.left -= k
		b = b[k:]
		if f.left == 0 {
			handle(f.index, f.buf)
			f.index++
			f.lenN = 0
		}
	}
}
