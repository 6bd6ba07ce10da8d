package election

import "sync"

// SessionSignals implements the signalling half of a Session for backend
// authors: Renewals (latest wins), Done and Err. Embed it by value in a
// session struct and report with Push and End. The zero value is ready to
// use; it must not be copied once used. Its methods are safe for
// concurrent use.
type SessionSignals struct {
	ready    sync.Once
	renewals chan Renewal
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex
	err      error
}

// init makes the channels, once, on first use.
func (s *SessionSignals) init() {
	s.ready.Do(func() {
		s.renewals = make(chan Renewal, 1)
		s.done = make(chan struct{})
	})
}

// Init prepares the signals. Optional: the zero value prepares itself on
// first use; calling Init again, or after use, changes nothing.
func (s *SessionSignals) Init() { s.init() }

// Renewals implements Session.Renewals.
func (s *SessionSignals) Renewals() <-chan Renewal {
	s.init()
	return s.renewals
}

// Done implements Session.Done.
func (s *SessionSignals) Done() <-chan struct{} {
	s.init()
	return s.done
}

// Err implements Session.Err.
func (s *SessionSignals) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// End records why the session ended and closes Done; only the first call
// counts. It reports whether this call ended the session.
func (s *SessionSignals) End(err error) bool {
	s.init()
	ended := false
	s.once.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		close(s.done)
		ended = true
	})
	return ended
}

// Push delivers a renewal outcome, replacing one the reader has not taken
// yet (latest wins). It never blocks.
func (s *SessionSignals) Push(r Renewal) {
	s.init()
	for {
		select {
		case s.renewals <- r:
			return
		default:
		}
		select {
		case <-s.renewals:
		default:
		}
	}
}
