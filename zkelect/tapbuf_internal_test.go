package zkelect

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// scriptedConn answers each Read with its next chunk (as much of it as
// fits), and the chunk's error with its last byte; then io.EOF.
type scriptedConn struct {
	net.Conn // nil: only Read is called
	chunks   []chunk
	reads    int
	largest  int // the largest buffer a Read was given
}

type chunk struct {
	b   []byte
	err error
}

func (c *scriptedConn) Read(b []byte) (int, error) {
	c.reads++
	c.largest = max(c.largest, len(b))
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(b, c.chunks[0].b)
	c.chunks[0].b = c.chunks[0].b[n:]
	if len(c.chunks[0].b) > 0 {
		return n, nil
	}
	err := c.chunks[0].err
	c.chunks = c.chunks[1:]
	return n, err
}

// frame is a ZooKeeper frame: a 4-byte length, then payload.
func frame(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

// readFrames reads the stream as go-zookeeper does: a 4-byte length, then
// the payload, each with io.ReadFull.
func readFrames(t *testing.T, r io.Reader, n int) [][]byte {
	t.Helper()
	var out [][]byte
	for range n {
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			t.Fatalf("frame %d: length: %v", len(out), err)
		}
		p := make([]byte, binary.BigEndian.Uint32(l[:]))
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatalf("frame %d: payload: %v", len(out), err)
		}
		out = append(out, p)
	}
	return out
}

// TestTapRead_ServesFramesCutAnywhere: through the read buffer, frames
// cut into chunks anywhere (a length split, a payload across several
// reads, frames far larger than the buffer) read back whole and in order,
// and the tap's frame follower sees every byte once: the token of a
// create whose reply is split across reads, and comes after a frame of
// 40 KiB, is recorded. A read of the buffer's size or more, once the
// buffer is drained, goes to the connection directly.
func TestTapRead_ServesFramesCutAnywhere(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const xid, zxid, session = 7, 0x1234_5678_9abc, 0x77
	connect := make([]byte, 16) // protocol version, timeout, session id
	binary.BigEndian.PutUint64(connect[8:16], session)
	path := "/k/" + protectedPrefix + "g-lock-0000000001"
	reply := binary.BigEndian.AppendUint32(nil, xid)
	reply = binary.BigEndian.AppendUint64(reply, zxid)
	reply = binary.BigEndian.AppendUint32(reply, 0) // no error
	reply = binary.BigEndian.AppendUint32(reply, uint32(len(path)))
	reply = append(reply, path...)
	big := make([]byte, 40<<10)
	for i := range big {
		big[i] = byte(r.IntN(256))
	}
	small := []byte("event")
	want := [][]byte{connect, big, small, reply, small}
	var stream []byte
	for _, p := range want {
		stream = append(stream, frame(p)...)
	}
	for round := range 50 {
		var chunks []chunk
		for b := stream; len(b) > 0; {
			k := min(len(b), 1+r.IntN(30<<10))
			if round%2 == 0 {
				k = min(len(b), 1+r.IntN(40))
			}
			chunks = append(chunks, chunk{b: b[:k]})
			b = b[k:]
		}
		sc := &scriptedConn{chunks: chunks}
		tp := newTap()
		c := &tappedConn{Conn: sc, t: tp, creates: map[int32]struct{}{xid: {}}}
		c.in.head = 16 + 4 + 512
		got := readFrames(t, c, len(want))
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("round %d: frame %d differs (%d bytes, want %d)", round, i, len(got[i]), len(want[i]))
			}
		}
		n, ok := tp.take(path)
		if !ok || n.zxid != zxid || n.session != session {
			t.Fatalf("round %d: the tap recorded %+v, %v for %s; want zxid %#x, session %#x", round, n, ok, path, zxid, session)
		}
		if sc.largest < len(big)-readBufSize {
			t.Fatalf("round %d: the largest read of the connection was %d bytes: the rest of the 40 KiB frame was not read directly", round, sc.largest)
		}
	}
	// Whole frames arriving together cost one read of the connection.
	sc := &scriptedConn{chunks: []chunk{{b: append(frame(small), frame(small)...)}}}
	c := &tappedConn{Conn: sc, t: newTap(), creates: map[int32]struct{}{}}
	readFrames(t, c, 2)
	if sc.reads != 1 {
		t.Fatalf("two frames that arrived in one chunk took %d reads of the connection, want 1", sc.reads)
	}
}

// TestTapRead_ErrorWithBytes: bytes that come with an error are returned
// without it; a timeout is not replayed later (under the next frame's
// deadline), and a lasting error is returned by the next read of the
// connection.
func TestTapRead_ErrorWithBytes(t *testing.T) {
	sc := &scriptedConn{chunks: []chunk{
		{b: frame([]byte("one")), err: os.ErrDeadlineExceeded},
		{b: frame([]byte("two"))},
	}}
	c := &tappedConn{Conn: sc, t: newTap(), creates: map[int32]struct{}{}}
	got := readFrames(t, c, 2)
	if string(got[0]) != "one" || string(got[1]) != "two" {
		t.Fatalf("frames %q, want one, two", got)
	}
	var b [4]byte
	if _, err := c.Read(b[:]); !errors.Is(err, io.EOF) {
		t.Fatalf("after the stream: Read = %v, want io.EOF from the connection", err)
	}
}
