package zkelect

import (
	"testing"
	"time"
)

// TestAnchor_CountsFromASyncAQuarterTimeoutOlderOnAnEnsemble drives
// Backend.anchor with made-up times: on a connection to an ensemble (or
// one whose server's role is not known) a renewal counts from the latest
// sync answered at least a quarter of the session timeout before it was
// sent, or from the dial; on a connection to a single server, from its own
// sync; on a connection that is no longer the current one, not at all.
func TestAnchor_CountsFromASyncAQuarterTimeoutOlderOnAnEnsemble(t *testing.T) {
	b := &Backend{tap: newTap()}
	b.negotiatedMs.Store(2000) // the lag is 500 ms
	t0 := time.Unix(1_000_000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	c := &tappedConn{dialed: ms(-100)}
	b.tap.cur.Store(c)
	for _, step := range []struct {
		sent, answered int
		want           int
	}{
		{0, 1, -100},     // nothing older: the dial
		{300, 302, -100}, // the sync at 0 was answered only 299 ms before
		{501, 503, 0},    // answered at 1, 500 ms before: it counts
		{700, 702, 0},    // the one at 300 was answered 398 ms before
		{802, 810, 300},  // now it counts (answered at 302)
		{805, 807, 300},  // answered out of order: the one at 501 (answered 503) not yet
		{1003, 1004, 501},
		{1400, 1401, 805}, // the latest sent of those old enough, not the latest answered
	} {
		at, ok := b.anchor(c, ms(step.sent), ms(step.answered))
		if !ok || !at.Equal(ms(step.want)) {
			t.Fatalf("sync sent at %d ms: counts from %v ms (ok %v), want %d ms", step.sent, at.Sub(t0).Milliseconds(), ok, step.want)
		}
	}
	c.role.Store(roleEnsemble)
	if at, _ := b.anchor(c, ms(1500), ms(1501)); !at.Equal(ms(805)) {
		t.Fatalf("on an ensemble: counts from %v ms, want 805", at.Sub(t0).Milliseconds())
	}
	c.role.Store(roleSingle)
	if at, _ := b.anchor(c, ms(1600), ms(1601)); !at.Equal(ms(1600)) {
		t.Fatalf("on a single server: counts from %v ms, want its own sync's 1600", at.Sub(t0).Milliseconds())
	}
	b.tap.cur.Store(&tappedConn{dialed: ms(1700)})
	if _, ok := b.anchor(c, ms(1800), ms(1801)); ok {
		t.Fatal("a sync on a connection that is no longer go-zookeeper's counted")
	}
}

func TestRoleOf(t *testing.T) {
	for config, want := range map[string]int32{
		"": roleSingle, // standalone
		"server.1=127.0.0.1:2888:3888:participant;0.0.0.0:2181\nversion=100000000":                                                                      roleSingle,
		"server.1=127.0.0.1:22845:31467:participant\nserver.2=127.0.0.1:24629:16903:participant\nserver.3=127.0.0.1:14746:16174:participant\nversion=0": roleEnsemble,
		"server.1=a:1:2:participant\nserver.2=b:1:2:observer\nversion=1":                                                                                roleEnsemble,
	} {
		if got := roleOf([]byte(config)); got != want {
			t.Errorf("roleOf(%q) = %d, want %d", config, got, want)
		}
	}
}
