package zkelect

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
)

// The instant a renewal counts from.
//
// The ZooKeeper server that expires sessions is the ensemble's leader
// server. It touches a session when one of its own clients sends it a
// packet, and when a client connects to it or through a follower (the
// session's creation, or its revalidation). Of a follower's (or an
// observer's) clients it hears only through the follower's answers to its
// pings, every tickTime/2, each of which lists the sessions the follower
// heard from since the previous one. A sync answered through a follower
// shows that the follower's link to the leader server carried the sync,
// not that it carried the report of the sync's touch: the link may break
// just after, and the leader server then counts the session from the
// report before, up to a renewal earlier.
//
// So a renewal counts from an older sync: the latest one that was answered
// at least a quarter of the session timeout before this one was sent.
// Between the two, the follower answered a ping of the leader server
// (tickTime/2 or less apart, since a server grants no session timeout
// under 2 × tickTime unless its minSessionTimeout says otherwise), and
// that answer, which listed the older sync's touch, went up the link
// before the newer sync did (one TCP stream, in order). Failing such a
// sync, it counts from the connection's dial. The same rule holds on a
// connection to the leader server: cut off from its followers, it answers
// its own clients' syncs until it steps down, up to about a tickTime after
// its followers gave up on it and began to elect another, which counts
// the session from its start; the quarter timeout and DeadlineMargin
// cover that tick when they add up to a tickTime (always from a session
// timeout of 4 × tickTime; see docs/zookeeper.md).
//
// Only a single server (standalone, or an ensemble of one) touches every
// session on every packet and has no one to hand over to: on a connection
// to it a renewal counts from its own sync. The connection reads the
// ensemble's membership from /zookeeper/config (empty on a standalone
// server, one server.N line per member otherwise; world-readable) after
// each connection; until that read is answered, and when it fails, the
// connection counts as one to an ensemble.

// Roles of the server a connection reaches.
const (
	roleUnknown  int32 = iota // not known (yet): counted as an ensemble
	roleSingle                // a standalone server, or an ensemble of one
	roleEnsemble              // a member of an ensemble of two or more
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
	if c.role.Load() == roleSingle {
		return sent, true
	}
	at = c.dialed
	if c.heard.After(at) {
		at = c.heard
	}
	return at, true
}

// strictAnchor reports whether renewals on the current connection count
// from an older sync (its server is not known to be a single one).
func (b *Backend) strictAnchor() bool {
	c := b.tap.cur.Load()
	return c == nil || c.role.Load() != roleSingle
}

// readRole reads the ensemble's membership on the current connection and
// records its role there. It tries a few times while that connection is
// current, the Backend open and ctx alive; on failure the connection
// stays strict.
func (b *Backend) readRole(ctx context.Context) {
	for try := range 3 {
		c := b.tap.cur.Load()
		if c == nil || b.isClosed() || ctx.Err() != nil {
			return
		}
		if try > 0 {
			time.Sleep(100 * time.Millisecond << try)
		}
		data, err := call(ctx, b, func() ([]byte, error) {
			d, _, err := b.conn.Get(configNode)
			return d, err
		}, nil)
		if b.tap.cur.Load() != c {
			continue // answered on another connection, or not at all: ask that one
		}
		if err == nil {
			c.role.Store(roleOf(data))
			b.roleReads.Add(1)
			return
		}
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNoAuth) {
			c.role.Store(roleEnsemble) // a server before 3.5, or one that hides it
			b.roleReads.Add(1)
			return
		}
	}
}

// readRoleAsync runs readRole in the background (the event callback must
// not block).
func (b *Backend) readRoleAsync() {
	b.spawn(func() { b.readRole(context.Background()) })
}

// configNode holds the ensemble's membership (ZooKeeper 3.5 and later).
const configNode = "/zookeeper/config"

// roleOf reads the data of /zookeeper/config: one "server.N=..." line per
// member, observers included; none on a standalone server.
func roleOf(config []byte) int32 {
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(config))
	for sc.Scan() {
		if strings.HasPrefix(strings.TrimSpace(sc.Text()), "server.") {
			n++
		}
	}
	if n <= 1 {
		return roleSingle
	}
	return roleEnsemble
}
