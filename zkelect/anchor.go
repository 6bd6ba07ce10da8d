package zkelect

import (
	"bufio"
	"bytes"
	"io"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// The instant a renewal counts from.
//
// The ZooKeeper server that expires sessions is the ensemble's leader
// server (or a standalone server). It touches a session when one of its
// own clients sends it a packet, and when a client connects to it or
// through a follower (the session's creation, or its revalidation). Of a
// follower's (or an observer's) clients it hears only through the
// follower's answers to its pings, every tickTime/2, each of which lists
// the sessions the follower heard from since the previous one. A sync
// answered through a follower shows that the follower's link to the leader
// server carried the sync, not that it carried the report of the sync's
// touch: the link may break just after, and the leader server then counts
// the session from the report before, up to a renewal earlier.
//
// So on a connection to a follower a renewal counts from an older sync:
// the latest one that was answered at least a quarter of the session
// timeout before this one was sent. Between the two, the follower answered
// a ping of the leader server (tickTime/2 or less apart, since a server
// grants no session timeout under 2 × tickTime unless its
// minSessionTimeout says otherwise), and that answer, which listed the
// older sync's touch, went up the link before the newer sync did (one TCP
// stream, in order). Failing such a sync, it counts from the connection's
// opening. On a connection to the leader server or to a standalone one, a
// renewal counts from its own sync. The server's role comes from its
// answer to `srvr` (the four-letter word ZooKeeper allows by default),
// asked once per connection on a connection of its own; a server that
// changes role closes its client connections. Until it answers, or when it
// refuses, the connection is taken to reach a follower.

// Roles of the server a connection reaches.
const (
	roleUnknown int32 = iota // not known (yet): counted as a follower
	roleLeader               // the leader server, or a standalone one: it expires sessions
	roleLearner              // a follower or an observer
)

// syncMark is one answered sync, on the wall clock.
type syncMark struct{ sent, answered time.Time }

// anchor records a sync sent at sent on connection c and answered at
// answered, and returns the instant to count the session's TTL from (see
// above). ok is false when c is no longer go-zookeeper's connection: the
// sync may have gone on another.
func (b *Backend) anchor(c *tappedConn, sent, answered time.Time) (at time.Time, ok bool) {
	if c == nil || b.tap.cur.Load() != c {
		return time.Time{}, false
	}
	lag := time.Duration(b.negotiatedMs.Load()) * time.Millisecond / 4
	c.ancMu.Lock()
	defer c.ancMu.Unlock()
	// Syncs answered lag or more before this one was sent now count; of
	// them only the latest sent matters, from now on too.
	keep := c.recent[:0]
	for _, m := range c.recent {
		if m.answered.Add(lag).After(sent) {
			keep = append(keep, m)
		} else if m.sent.After(c.heard) {
			c.heard = m.sent
		}
	}
	c.recent = append(keep, syncMark{sent, answered})
	if c.role.Load() == roleLeader {
		return sent, true
	}
	at = c.dialed
	if c.heard.After(at) {
		at = c.heard
	}
	return at, true
}

// strictAnchor reports whether renewals on the current connection count
// from an older sync (the server is not known to be the leader server).
func (b *Backend) strictAnchor() bool {
	c := b.tap.cur.Load()
	return c == nil || c.role.Load() != roleLeader
}

// probeRole asks, in the background, the server that c reaches for its
// role, dialling with d as go-zookeeper did.
func (b *Backend) probeRole(c *tappedConn, d zk.Dialer, network, address string) {
	timeout := min(b.timeout/4, time.Second)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		c.role.Store(b.askRole(d, network, address, timeout))
	}()
}

// askRole asks address for its `srvr` answer and reads the role from its
// Mode line. Close closes a probe still waiting.
func (b *Backend) askRole(d zk.Dialer, network, address string, timeout time.Duration) int32 {
	conn, err := d(network, address, timeout)
	if err != nil || conn == nil {
		return roleUnknown
	}
	defer conn.Close()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return roleUnknown
	}
	b.probes[conn] = struct{}{}
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.probes, conn)
		b.mu.Unlock()
	}()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return roleUnknown
	}
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return roleUnknown
	}
	answer, _ := io.ReadAll(io.LimitReader(conn, 64<<10))
	return roleOf(answer)
}

// roleOf reads a `srvr` answer's Mode line.
func roleOf(srvr []byte) int32 {
	sc := bufio.NewScanner(bytes.NewReader(srvr))
	for sc.Scan() {
		mode, ok := strings.CutPrefix(sc.Text(), "Mode: ")
		if !ok {
			continue
		}
		switch strings.TrimSpace(mode) {
		case "leader", "standalone":
			return roleLeader
		case "follower", "observer":
			return roleLearner
		}
		return roleUnknown
	}
	return roleUnknown
}
