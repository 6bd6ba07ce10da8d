package zkelect

import (
	"bytes"
	"context"
	"errors"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure/election"
)

// A handover record lets the next waiter prove itself first without
// reading the queue.
//
// A waiter proves itself first with a read of the key's children, which
// returns every name in the queue: at 1,000 contenders some 55 KB that the
// server builds and the client parses on every handoff, and the largest
// part of a handoff's time that grows with the queue. But a waiter W whose
// predecessor P was proven first needs no such read when P's node goes:
// ZooKeeper numbers a parent's sequential children from one counter that
// only grows, so no node ahead of P can appear after P was proven first,
// and none between P and W after W learned that P is its predecessor (a
// read, or predict: both exact for a node with a tenure name, see below).
// When P is deleted, W is first, if P was deleted as a proven head and W's
// node still exists.
//
// So a session releasing a node it proved first deletes it and, in the
// same multi, sets the key node's data to "tenure-released <P's name>",
// guarded by the data version the session read: the record. W, woken by
// P's deletion, reads the key node: a record naming P, with W's node
// there, is the proof. W knows its node is there from a watch it set on it
// when it created it (on a long queue: one request per campaign, off the
// handoff's path; see readRecord for why its silence proves the node),
// or, without one, from an exists sent together with the read.
// Anything else (P abandoned its wait, its session expired, P is another
// client's node such as Curator's or kazoo's, the record was overwritten
// or refused) sends W to the read of the children, one round trip later.
//
// Why a name settles it: tenure's node names carry a uuid that no other
// campaign uses, and only tenure writes records, so a record naming P is
// about that one node, in the key node's current incarnation (a container
// made again starts with no data). predict's guesses are exact for such a
// name: the name holds its sequence, and the sequence right below W's (or
// one above the highest of the last read) leaves no room for another node.
//
// The record is written only where it pays and only over what is tenure's:
// a session records a handover only for a node whose proving read showed at
// least 32 children (WithHandoverRecords), and only when that read found the
// key node's data empty or a record already; a waiter reads one only when
// its session's last look at the queue counted as many. On short queues
// nothing changes.
//
// ZooKeeper's counter is 32 bits: after 2³¹ creates under one key it wraps,
// and a newcomer sorts before everyone (docs/zookeeper.md). A node whose
// sequence is near the wrap (maxRecordSeq) never trusts a record, so a
// waiter would have to see some 16.7 million creates under its key while it
// waits for the record to elect it next to such a newcomer.

// defaultHandoverQueue is WithHandoverRecords' default.
const defaultHandoverQueue = 32

// recordPrefix starts a handover record (the key node's data) before the
// released node's name.
const recordPrefix = "tenure-released "

// maxRecordSeq is the lowest sequence of a waiter that never trusts a
// record (see above).
const maxRecordSeq = 1<<31 - 1<<24

// WithHandoverRecords sets the queue length, in children of the key's node,
// from which a releasing head records the handover in the key node's data
// ("tenure-released <node name>") and its successor reads that record
// instead of the queue (docs/zookeeper.md). Default 32. 1 uses records on
// every queue; 0 or less, on none: the backend then never writes the key
// node's data. A key node whose data is neither empty nor a record is never
// written.
func WithHandoverRecords(minQueue int) Option {
	return func(o *options) { o.handover, o.handoverSet = int32(max(min(minQueue, 1<<30), 0)), true }
}

// keyNode is what one read of a key's node showed.
type keyNode struct {
	data    []byte
	version int32 // the data's version: the record's write is guarded by it
	size    int32 // the node's children then
}

// recordsFor reports whether name, a node of this session under key,
// would use handover records: the session's last look at key's queue saw a
// long one, and name's sequence is far from the counter's wrap.
func (s *session) recordsFor(key, name string) bool {
	if s.b.handover <= 0 {
		return false
	}
	seq, ok := parseSeq(name)
	if !ok || seq < 0 || seq >= maxRecordSeq {
		return false
	}
	s.mu.Lock()
	k := s.keys[key]
	s.mu.Unlock()
	return !k.noRecord && k.size >= s.b.handover
}

// useRecord reports whether t's next wake-up reads the handover record
// instead of the queue.
func (s *session) useRecord(t election.Ticket) bool {
	s.mu.Lock()
	_, unsure := s.unsure[t.Name]
	s.mu.Unlock()
	// A node found after a lost create reply may have an older twin of
	// its guid ahead of it, which only a read of the queue shows (and
	// WaitHead then deletes).
	return !unsure && s.recordsFor(t.Key, path.Base(t.Name))
}

// provesFirst reports whether n, read after pred's deletion woke a waiter,
// records pred's release as a proven head.
func (n *keyNode) provesFirst(pred string) bool {
	return n != nil && len(n.data) == len(recordPrefix)+len(pred) &&
		string(n.data[:len(recordPrefix)]) == recordPrefix && string(n.data[len(recordPrefix):]) == pred
}

// markHead records t, just proven first, so that its release records the
// handover: only when n, a read of the key's node made by the wait that
// proved it, showed a long queue and data a record may replace.
func (s *session) markHead(t election.Ticket, n *keyNode) {
	if n == nil || s.b.handover <= 0 || n.size < s.b.handover ||
		(len(n.data) > 0 && !bytes.HasPrefix(n.data, []byte(recordPrefix))) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys[t.Key].noRecord {
		return
	}
	s.heads[t.Name] = n.version
}

// takeHead returns the key node's data version markHead kept for t, and
// forgets it.
func (s *session) takeHead(t election.Ticket) (int32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.heads[t.Name]
	delete(s.heads, t.Name)
	return v, ok
}

// releaseRecorded deletes t's node and records the handover in one multi.
// done is false when the multi failed, its outcome unknown or the record
// refused: the caller deletes the node alone (a guarded delete is safe to
// send either way). A record the key's ACL refuses is not tried again on
// that key by this session.
//
// The key is taken from t's node path: Close releases tickets that carry
// no key.
func (s *session) releaseRecorded(ctx context.Context, t election.Ticket, version int32) (done bool) {
	key := path.Dir(t.Name)
	resp, err := call(ctx, s.b, func() ([]zk.MultiResponse, error) {
		return s.b.conn.Multi(
			&zk.DeleteRequest{Path: t.Name, Version: 0},
			&zk.SetDataRequest{Path: key, Data: []byte(recordPrefix + path.Base(t.Name)), Version: version},
		)
	}, nil)
	if err == nil {
		return true
	}
	refused := errors.Is(err, zk.ErrNoAuth)
	for _, r := range resp {
		refused = refused || errors.Is(r.Error, zk.ErrNoAuth)
	}
	if refused {
		s.updateKey(key, func(k *keyState) { k.noRecord = true })
	}
	return false
}

// readRecord reads key's node for a wake-up (wake), and learns whether
// own, the waiter's node, still exists: from ownCh, a watch on it (Enqueue
// sets one on long queues), or else from an exists sent together with the
// read, on another call worker (the caller's call holds a count of the
// Backend's WaitGroup for it).
//
// The watch needs no request: ZooKeeper sends a client the events of a
// transaction before its reply to any later request, and go-zookeeper's
// receive loop hands each event to its watch channel before it hands on
// the next reply. So when the read, sent after the predecessor's event,
// is answered, an event of own from the same transaction (a multi that
// deleted both) or any earlier one is already in ownCh. An event found
// there ends the wait as the own watch's would (own).
//
// A key node the ACL refuses to read turns records off for key.
func (s *session) readRecord(key, own string, ownCh <-chan zk.Event) (woken, error) {
	type exists struct {
		ok  bool
		err error
	}
	var ch chan exists
	if ownCh == nil {
		ch = make(chan exists, 1)
		s.b.run(func() {
			ok, _, err := s.b.conn.Exists(own)
			ch <- exists{ok, err}
		})
	}
	data, st, err := s.b.conn.Get(key)
	e := exists{ok: true}
	if ch != nil {
		e = <-ch
	} else {
		select {
		case ev := <-ownCh:
			// woke: the predecessor's event was taken (its watch is
			// spent, not to be parked).
			return woken{woke: true, own: true, ownEvent: ev}, nil
		default:
		}
	}
	w := woken{woke: true, node: &keyNode{}, ownGone: e.err == nil && !e.ok}
	switch {
	case e.err != nil:
		return woken{woke: true}, translate("exists "+own, e.err)
	case errors.Is(err, zk.ErrNoAuth):
		s.updateKey(key, func(k *keyState) { k.noRecord = true })
	case errors.Is(err, zk.ErrNoNode):
		// Gone as it was read (then own is gone too): no record.
	case err != nil:
		return woken{woke: true}, translate("get "+key, err)
	default:
		w.node = &keyNode{data: data, version: st.Version, size: st.NumChildren}
	}
	return w, nil
}
