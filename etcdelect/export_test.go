package etcdelect

import (
	"time"

	"github.com/tenure-go/tenure/election"
)

// OwnWatchBacklog drains the session's watch on its entry name for key
// and returns how many responses it held (waiting up to 100 ms for each
// next one, as the client hands them over one at a time), or -1 when the
// session has no such watch.
func OwnWatchBacklog(es election.Session, key string) int {
	s := es.(*session)
	s.ownMu.Lock()
	w := s.owns[entryName(key, s.id)]
	s.ownMu.Unlock()
	if w == nil {
		return -1
	}
	n := 0
	for {
		select {
		case _, ok := <-w.ch:
			if !ok {
				return n
			}
			n++
		case <-time.After(100 * time.Millisecond):
			return n
		}
	}
}
