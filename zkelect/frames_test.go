package zkelect

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestFrames_SplitsAnyChunking: frames hands each frame's first bytes to
// the handler, in order, once the frame is complete, however the stream is
// cut into reads or writes; empty frames included, and bytes past the
// head never kept.
func TestFrames_SplitsAnyChunking(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		var stream bytes.Buffer
		var want [][]byte
		for range 1 + r.IntN(20) {
			payload := make([]byte, []int{0, 3, 8, 16, 40, 5000}[r.IntN(6)])
			for i := range payload {
				payload[i] = byte(r.IntN(256))
			}
			_ = binary.Write(&stream, binary.BigEndian, uint32(len(payload)))
			stream.Write(payload)
			want = append(want, payload[:min(len(payload), 16)])
		}
		f := frames{head: 16}
		var got [][]byte
		handle := func(index int, head []byte) {
			if index != len(got) {
				t.Fatalf("round %d: frame index %d, want %d", round, index, len(got))
			}
			got = append(got, bytes.Clone(head))
		}
		b := stream.Bytes()
		for len(b) > 0 {
			k := min(len(b), 1+r.IntN(70))
			f.feed(b[:k], handle)
			b = b[k:]
		}
		if len(got) != len(want) {
			t.Fatalf("round %d: %d frames, want %d", round, len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("round %d, frame %d: head %x, want %x", round, i, got[i], want[i])
			}
		}
		if cap(f.buf) > 64 {
			t.Fatalf("round %d: kept a buffer of %d bytes for a 16-byte head", round, cap(f.buf))
		}
	}
}
