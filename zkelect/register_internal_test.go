package zkelect

import (
	"errors"
	"testing"

	"github.com/tenure-go/tenure"
)

// TestRegister_ASessionReplacedBeforeItIsTrackedEndsAtOnce: an expiry that
// go-zookeeper reports after a new session's last confirm but before the
// Backend tracks it (expireStale then sees no such session) ends the
// session when it is registered, instead of at its next confirm.
func TestRegister_ASessionReplacedBeforeItIsTrackedEndsAtOnce(t *testing.T) {
	b := bareBackend()
	b.sessionID.Store(0x2) // the connection moved on to another session
	s := &session{b: b, id: 0x1}
	s.Init()
	err := b.register(s)
	if !errors.Is(err, tenure.ErrSessionExpired) {
		t.Fatalf("register of a replaced session: %v, want tenure.ErrSessionExpired", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("the replaced session's Done is open")
	}
	if len(b.sessions) != 0 {
		t.Fatalf("the replaced session is tracked: %d sessions", len(b.sessions))
	}

	live := &session{b: b, id: 0x2}
	live.Init()
	if err := b.register(live); err != nil {
		t.Fatalf("register of the connection's session: %v", err)
	}
	b.wg.Done() // no keepAlive started here
	if _, ok := b.sessions[live]; !ok || live.Err() != nil {
		t.Fatalf("the live session: tracked %v, Err %v", ok, live.Err())
	}

	b.closed = true
	late := &session{b: b, id: 0x2}
	late.Init()
	if err := b.register(late); !errors.Is(err, tenure.ErrClosed) {
		t.Fatalf("register after Close: %v, want tenure.ErrClosed", err)
	}
}
