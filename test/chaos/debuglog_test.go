package chaos

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// A candidate keeps its last debugLines log lines (the elector's and the
// backend's, at Debug) in memory and writes them to stderr on SIGUSR2, which
// the harness sends when a lane has no leader (diagnose): what each
// candidate last did is what a stalled lane needs explained, and writing
// every line of every candidate to stderr would bury the test's output.
const debugLines = 400

// ring is a zapcore.WriteSyncer that keeps the last lines written to it.
type ring struct {
	mu    sync.Mutex
	lines [][]byte
	next  int
	full  bool
}

// newRing returns an empty ring of debugLines lines.
func newRing() *ring { return &ring{lines: make([][]byte, debugLines)} }

// Write keeps p (one encoded log entry) as the newest line, dropping the
// oldest when the ring is full.
func (r *ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines[r.next] = append(r.lines[r.next][:0], p...)
	r.next = (r.next + 1) % len(r.lines)
	if r.next == 0 {
		r.full = true
	}
	return len(p), nil
}

// Sync does nothing: the lines stay in memory until dump.
func (r *ring) Sync() error { return nil }

// dump writes the kept lines, oldest first, to stderr, each after prefix.
func (r *ring) dump(prefix string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	start, n := 0, r.next
	if r.full {
		start, n = r.next, len(r.lines)
	}
	for i := range n {
		_, _ = os.Stderr.Write(append([]byte(prefix), r.lines[(start+i)%len(r.lines)]...))
	}
	_, _ = os.Stderr.Write([]byte(prefix + "-- end of log\n"))
}

// debugLogger returns a Debug-level logger into a ring that is dumped on
// every SIGUSR2, and a func that stops the dumping.
func debugLogger(id string) (*zap.Logger, func()) {
	r := newRing()
	enc := zap.NewDevelopmentEncoderConfig()
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), r, zapcore.DebugLevel))
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				r.dump(id + " | ")
			case <-done:
				return
			}
		}
	}()
	return log, func() { signal.Stop(ch); close(done) }
}
