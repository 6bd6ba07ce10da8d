package zkelect

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

func newGUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return formatGUID(b), nil
}

// nextGUID is the guid a session's next campaign on a key takes after one
// with guid g: the first 16 bytes of g's SHA-256, shaped as newGUID's. Any
// client that saw a node of g can name its successor (see predict); the
// chain starts from newGUID's random one in each session, so its guids are
// as unique as random ones.
func nextGUID(g string) string {
	sum := sha256.Sum256([]byte(g))
	return formatGUID([16]byte(sum[:16]))
}

// formatGUID shapes b as a version 4 UUID, as Curator's UUID.randomUUID.
func formatGUID(b [16]byte) string {
	b[6] = b[6]&0x0f | 0x40 // version 4, as Curator's UUID.randomUUID
	b[8] = b[8]&0x3f | 0x80
	// 8-4-4-4-12 hex digits, without fmt (a campaign's path to its create).
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	hex.Encode(out[9:13], b[4:6])
	hex.Encode(out[14:18], b[6:8])
	hex.Encode(out[19:23], b[8:10])
	hex.Encode(out[24:36], b[10:16])
	out[8], out[13], out[18], out[23] = '-', '-', '-', '-'
	return string(out[:])
}

// ensureParents creates key and its missing ancestors as container nodes.
// made lists the nodes it created: an Enqueue that fails drops each of
// them that never had a child (dropUnusedKey), and a create given up in
// flight drops its node itself once it lands. ZooKeeper never deletes a
// container that never had a child, and that one keeps its ancestors. A
// create whose reply was lost is not counted: the node found after it may
// be another client's or an administrator's.
//
// A create that fails for another reason than the node's existence is
// forgiven when the node exists: the server checks the create permission
// on the parent before it looks for the node, so an ancestor that an
// administrator made under a node only the administrator may write to
// ("/apps" closed, "/apps/billing" open to the service) answers NoAuth,
// not NodeExists. (Curator's mkdirs asks whether each node exists first;
// this costs that round trip only when a create fails.)
func (s *session) ensureParents(ctx context.Context, key string) (made []string, err error) {
	parts := strings.Split(key[1:], "/")
	for pass := 0; ; pass++ {
		again, err := s.createPath(ctx, parts, &made)
		if !again || pass == 2 {
			return made, err
		}
	}
}

// createPath is one walk of ensureParents down the path of parts. again
// reports a create that found its parent gone (another Enqueue dropped it,
// unused, since this walk passed it): the walk must start over.
func (s *session) createPath(ctx context.Context, parts []string, made *[]string) (again bool, err error) {
	p := ""
	for _, c := range parts {
		p += "/" + c
		node := p
		// Given up in flight (ctx ended), the create may still land. Only
		// a create that answered counts as made: a node found after a lost
		// reply may be an administrator's (a container and a persistent
		// node look alike to a client), and is left alone.
		undo := func(_ string, err error) {
			if err == nil {
				s.b.dropUnusedKey(node)
			}
		}
		_, err := call(ctx, s.b, func() (string, error) {
			return s.b.conn.CreateContainer(node, nil, zk.FlagContainer, s.b.acl)
		}, undo)
		switch {
		case err == nil:
			*made = append(*made, node)
			continue
		case errors.Is(err, zk.ErrNodeExists):
			continue
		case errors.Is(err, zk.ErrNoNode):
			return true, translate("create "+node, err)
		}
		if _, ok, serr := s.stat(ctx, node); serr == nil && ok {
			continue
		}
		return false, translate("create "+node, err)
	}
	return false, nil
}

// lostReply reports whether err is go-zookeeper's for a request whose
// reply was lost with its connection: the request may have been applied.
func lostReply(err error) bool {
	return errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer)
}

// dropUnusedKey deletes, in the background, a container of a key's path
// (the key or one of its ancestors) that an Enqueue created and then
// failed to queue under: ZooKeeper deletes a container once it has had a
// child and is empty, never one that had none (unless the servers set
// znode.container.maxNeverUsedIntervalMs), and that one would keep its
// ancestors too. A node that had a child is left to the server.
func (b *Backend) dropUnusedKey(key string) {
	b.reapLoop(reapAny, func() bool {
		ok, st, err := b.conn.Exists(key)
		switch {
		case err != nil:
			return false
		case !ok || st.NumChildren > 0 || st.Cversion > 0:
			return true
		}
		err = b.conn.Delete(key, st.Version)
		return err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNotEmpty) || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNoAuth)
	})
}

// stat reads p's Stat; ok is false when p does not exist.
func (s *session) stat(ctx context.Context, p string) (*zk.Stat, bool, error) {
	type res struct {
		ok bool
		st *zk.Stat
	}
	r, err := call(ctx, s.b, func() (res, error) {
		ok, st, err := s.b.conn.Exists(p)
		return res{ok, st}, err
	}, nil)
	if err != nil {
		return nil, false, translate("exists "+p, err)
	}
	return r.st, r.ok, nil
}

// MaxIdentityLen is the longest identity Enqueue takes, in bytes: it is the
// node's data, far below the server's default 1 MB limit on a request.
const MaxIdentityLen = 64 << 10

// Enqueue creates "<key>/_c_<uuid>-lock-<seq>", ephemeral and sequential,
// with the identity as data. When the reply is lost it finds the node by
// its uuid. When Enqueue fails (the caller gave up while a create or the
// read after it was in flight, the link went down before a node whose
// create reply went unread could be read, the session expired), any node
// it may have made is deleted in the background, once
// the link is back, until it is gone or the Backend closes, whichever of
// the connection's sessions owns it.
func (s *session) Enqueue(ctx context.Context, key, identity string) (_ election.Ticket, err error) {
	if len(identity) > MaxIdentityLen {
		// The identity is the node's data. The server drops the connection
		// (every elector's on this Backend) on a packet above its 1 MB
		// jute.maxbuffer, which would look like a lost reply, retried for good.
		return election.Ticket{}, fmt.Errorf("%w: zookeeper: identity of %d bytes is longer than %d", tenure.ErrInvalidConfig, len(identity), MaxIdentityLen)
	}
	// One entry per session and key, as the interface says: a node an
	// earlier campaign left (its delete failed) is returned, not doubled,
	// or it would stand ahead of its own session for good.
	s.mu.Lock()
	var prev string
	var prevZxid uint64
	for p, z := range s.nodes {
		if path.Dir(p) == key {
			prev, prevZxid = p, z
		}
	}
	s.mu.Unlock()
	if prev != "" {
		// One read: the node, if still this session's, and the identity it
		// carries. A failed read keeps prev: forgetting a node that may
		// still exist would leave it in the queue, owned by a live session
		// that no campaign knows of.
		type node struct {
			data []byte
			st   *zk.Stat
		}
		var n node
		if err := retry(ctx, func() error {
			var err error
			n, err = call(ctx, s.b, func() (node, error) {
				d, st, err := s.b.conn.Get(prev)
				return node{d, st}, err
			}, nil)
			if errors.Is(err, zk.ErrNoNode) {
				n, err = node{}, nil
			}
			return translate("get "+prev, err)
		}); err != nil {
			return election.Ticket{}, err
		}
		if n.st != nil && uint64(n.st.Czxid) == prevZxid && n.st.EphemeralOwner == s.id && s.alive() {
			return election.Ticket{Key: key, Identity: string(n.data), Token: prevZxid, Name: prev}, nil
		}
		s.forget(prev)
	}
	guid, err := s.nextGUID(key)
	if err != nil {
		return election.Ticket{}, err
	}
	prefix := key + "/" + protectedPrefix + guid + lockMarker
	// The nodes of this guid are this Enqueue's, but not always this
	// session's: go-zookeeper sends a request made while it has no
	// connection on its next one, whatever session that carries, so a
	// create made as the session expires unseen makes its node under the
	// connection's next session. So the nodes this Enqueue gives up are
	// deleted whichever session of the connection owns them (reapAny).
	//
	// A create given up while in flight: delete its node once it returns,
	// or, when its reply was lost too, whatever node it made.
	undo := func(p string, err error) {
		switch {
		case err == nil:
			s.deleteLater(p)
		case lostReply(err):
			s.b.reapGUID(key, guid)
		}
	}
	// A create whose reply was lost may have made a node that no read
	// found: when Enqueue fails after one, nothing of this guid may stay
	// (a node owned by a live session that no campaign knows would stand
	// in the queue for good).
	unknown := false
	var made []string // nodes of the key's path this Enqueue made (or may have)
	defer func() {
		if err != nil {
			for _, p := range made {
				s.b.dropUnusedKey(p)
			}
		}
		if unknown && err != nil {
			s.b.reapGUID(key, guid)
		}
	}()
	for attempt := 0; ; attempt++ {
		if !s.alive() {
			return election.Ticket{}, s.expired(errors.New("replaced before create"))
		}
		p, err := call(ctx, s.b, func() (string, error) {
			return s.b.conn.Create(prefix, []byte(identity), zk.FlagEphemeral|zk.FlagSequence, s.b.acl)
		}, undo)
		switch {
		case err == nil:
		case errors.Is(err, zk.ErrNoNode) && attempt < 3:
			m, err := s.ensureParents(ctx, key)
			made = append(made, m...)
			if err != nil {
				return election.Ticket{}, err
			}
			continue
		case lostReply(err):
			// The reply was lost: the node may exist.
			unknown = true
			found, ferr := s.findByGUID(ctx, key, guid)
			for errors.Is(ferr, tenure.ErrUnavailable) {
				// No connection yet (go-zookeeper tries its servers in
				// turn): the node's fate is still unknown; look again
				// until ctx ends.
				if !pause(ctx) {
					return election.Ticket{}, ctx.Err()
				}
				found, ferr = s.findByGUID(ctx, key, guid)
			}
			if ferr != nil {
				return election.Ticket{}, ferr
			}
			if found == "" {
				if !pause(ctx) {
					return election.Ticket{}, ctx.Err()
				}
				continue
			}
			p = found
		default:
			return election.Ticket{}, translate("create "+prefix, err)
		}
		// The create's reply carried the node's czxid and came on the
		// session that owns it: the tap kept both, so the node need not be
		// read. The queue is read next, for WaitHead's first look. Waiters
		// set no watch on their own node: the read after each wake-up shows
		// whether it is still there, and the leader's loss watch is set by
		// WatchLoss.
		var (
			czxid int64
			owner int64
			ch    <-chan zk.Event
			ok    = true
		)
		var prefetched []string
		readChildren := func() []string { // nil when the read fails
			c, err := call(ctx, s.b, func() ([]string, error) {
				c, _, err := s.b.conn.Children(key)
				return c, err
			}, nil)
			if err != nil {
				return nil
			}
			return c
		}
		var predicted contender
		if n, tapped := s.b.tap.take(p); tapped {
			czxid, owner = n.zxid, n.session
			var known bool
			predicted, known = s.predict(key, path.Base(p))
			var watched chan struct{}
			if owner == s.id && s.recordsFor(key, path.Base(p)) {
				// On a long queue the node is watched from the start: a
				// wake-up that reads a handover record then needs no read
				// of the node (handover.go). A failed watch costs that
				// read, nothing else.
				watched = make(chan struct{})
				go func() {
					defer close(watched)
					var werr error
					ch, _, ok, werr = s.watch(ctx, p)
					if werr != nil {
						ch, ok = nil, true
					}
				}()
			}
			if !known && owner == s.id {
				// No prediction (a node of another session is refused below):
				// read the queue.
				prefetched = readChildren()
			}
			if watched != nil {
				<-watched
			}
			if err := ctx.Err(); err != nil && owner == s.id && (watched != nil || !known) {
				// Given up before it could return: the node must go,
				// as when a read of it fails below.
				s.deleteLater(p)
				return election.Ticket{}, err
			}
		} else {
			if !unknown {
				s.b.tap.misses.Add(1)
			}
			// Without the tap's record (a reply the tap could not read, a
			// node found after a lost reply), read the node, with a watch
			// that follows it through WaitHead and WatchLoss, and the queue
			// at the same time (the two requests share the connection).
			children := make(chan []string, 1)
			go func() { children <- readChildren() }()
			var st *zk.Stat
			err = retry(ctx, func() (err error) {
				ch, st, ok, err = s.watch(ctx, p)
				return err
			})
			prefetched = <-children
			if err != nil {
				s.deleteLater(p)
				return election.Ticket{}, err
			}
			if ok {
				czxid, owner = st.Czxid, st.EphemeralOwner
			}
		}
		if !ok && s.alive() {
			// Deleted by another client between its create and the read:
			// the session lives on.
			return election.Ticket{}, fmt.Errorf("%w: zookeeper node %s was deleted as it was created", tenure.ErrOwnershipLost, p)
		}
		if !ok || owner != s.id {
			if ok { // made under the connection's next session (see above)
				s.deleteLater(p)
			}
			return election.Ticket{}, s.expired(fmt.Errorf("node %s not owned by the session", p))
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			// Close began while the create was in flight: it has taken
			// (or will take, under s.mu) its list of nodes to delete
			// without this one, which would otherwise block the queue for
			// as long as the ZooKeeper session lives.
			s.mu.Unlock()
			s.deleteLater(p)
			return election.Ticket{}, fmt.Errorf("%w: zookeeper: the session closed while %s was being created", tenure.ErrClosed, p)
		}
		s.nodes[p] = uint64(czxid)
		if ch != nil {
			s.parked[p] = ch
		}
		if prefetched != nil {
			s.prefetched[p] = prefetched
		}
		if predicted.name != "" {
			s.predicted[p] = predicted
		}
		if unknown {
			// An earlier create of this guid whose reply was lost may
			// still commit, or may not have shown in findByGUID's read:
			// WaitHead deletes it when it sees it ahead, and when this
			// node goes, every node of the guid goes (forget).
			s.unsure[p] = guid
		}
		s.mu.Unlock()
		return election.Ticket{Key: key, Identity: identity, Token: uint64(czxid), Name: p}, nil
	}
}

// deleteLater deletes p, a node this session's Enqueue created, in the
// background: at once if the link is up, or when it is back, whichever of
// the connection's sessions owns it (see Enqueue).
func (s *session) deleteLater(p string) { s.b.reap(reapAny, p, 0) }

// findByGUID looks for this session's node with guid under key. The read
// follows a sync: the server the connection now uses may lag behind the
// one that took the lost create.
func (s *session) findByGUID(ctx context.Context, key, guid string) (string, error) {
	children, err := call(ctx, s.b, func() ([]string, error) { return s.b.syncedChildren(key) }, nil)
	if errors.Is(err, zk.ErrNoNode) {
		return "", nil
	}
	if err != nil {
		return "", translate("children of "+key, err)
	}
	for _, c := range children {
		if guidOf(c) == guid {
			p := path.Join(key, c)
			st, ok, err := s.stat(ctx, p)
			if err != nil {
				return "", err
			}
			if ok && st.EphemeralOwner == s.id {
				return p, nil
			}
		}
	}
	return "", nil
}

// queue reads key's children and returns t's place among the contenders:
// how many are ahead of it (-1 when t's node is absent) and the one right
// before it. A read already made (by a wake-up) is passed as read, nil
// when there is none.
func (s *session) queue(ctx context.Context, t election.Ticket, read *[]string) (int, contender, error) {
	s.mu.Lock()
	children, ok := s.prefetched[t.Name] // read just after t's node was created
	delete(s.prefetched, t.Name)
	s.mu.Unlock()
	if read != nil {
		children, ok = *read, true
	}
	if !ok {
		var err error
		children, err = call(ctx, s.b, func() ([]string, error) {
			c, _, err := s.b.conn.Children(t.Key)
			return c, err
		}, nil)
		if err != nil && !errors.Is(err, zk.ErrNoNode) {
			return -1, contender{}, translate("children of "+t.Key, err)
		}
	}
	ahead, pred, found, tl := scan(children, path.Base(t.Name))
	if !found {
		return -1, contender{}, nil
	}
	s.updateKey(t.Key, func(k *keyState) {
		k.tail, k.woke, k.recorded, k.size = tl, "", false, int32(min(len(children), 1<<30))
	})
	return ahead, pred, nil
}

// keyState is what a session knows of one key's queue, for predict.
type keyState struct {
	tail tail   // what the session's last read of the key's children showed (zero: none, which predicts nothing)
	woke string // the contender whose deletion woke the waiter that made that read, when it showed the waiter first
	guid string // the guid of the session's last campaign on the key

	size     int32 // the key's children at the session's last look (a read of them, or of the key's node)
	recorded bool  // woke's successor was proven first by a handover record, after tail's read
	noRecord bool  // the key's ACL refused a handover record: none is tried again
}

// maxKeys bounds the keys a session keeps a keyState of: a session that
// campaigns on more keys forgets them all (its next create on each reads
// the queue, and takes a random guid).
const maxKeys = 64

// updateKey applies f to key's keyState.
func (s *session) updateKey(key string, f func(*keyState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.keys[key]
	if !ok && len(s.keys) >= maxKeys {
		clear(s.keys)
	}
	f(&k)
	s.keys[key] = k
}

// nextGUID returns the guid of the session's next campaign on key: the one
// after its last (nextGUID), or a random one for its first.
func (s *session) nextGUID(key string) (g string, err error) {
	// One hold of s.mu: two Enqueues of one session on one key (which the
	// elector never makes, but the Session allows) get different guids.
	s.updateKey(key, func(k *keyState) {
		if k.guid != "" {
			k.guid = nextGUID(k.guid)
		} else if k.guid, err = newGUID(); err != nil {
			return
		}
		g = k.guid
	})
	return g, err
}

// predict returns, without reading the queue, the contender right before
// name, a node this session has just created under key, when the
// session's last read of key's children shows which one that is.
//
// ZooKeeper numbers the sequential nodes of a parent from one counter,
// which every create of a child moves on by one, in the order the creates
// commit. If name's sequence is one above the highest of that read, no
// child was created between the node that had it and name: every node
// ahead of name that still exists was created before that read, so is in
// it. Those nodes, less the ones deleted since, are the queue ahead of
// name. The read's own node is not among them: its reader has deleted it
// (Dequeue forgets a node only once it is gone; while it is not, Enqueue
// returns it instead of creating another), or, when WatchLoss forgot it
// for a change of its data and deletes it in the background, it led, so
// it is the lowest of that read and below the others. So the highest of
// the others, if it still exists, is name's predecessor; WaitHead watches
// it at once, and reads the queue only when it is gone, as after any
// wake-up. The read saved is one request per requeue (and, at 1,000
// contenders, a reply of 1,000 names).
//
// The one case the counter cannot see: the key's node (a container)
// deleted once empty and made again, which restarts it, and a client that
// names its nodes the same from one incarnation to the next (kazoo keeps
// one prefix per Lock) whose node lands on the same sequence as before.
// The node watched may then stand further ahead than the predecessor: a
// wake-up too early, answered by a read, never a second leader.
//
// A prediction alone never elects: a node is first only when a read made
// after it was created shows it first, or when a handover record names its
// predecessor (handover.go). A wrong one (only in the case above, and only
// for a name that is not tenure's, which no record ever names) costs a
// wake-up at the wrong node's deletion, not a second leader. Every guess
// of a tenure name is exact: such a name holds a uuid no other campaign
// uses and its sequence, so the node found under it is the one guessed,
// and nothing lies between its sequence and name's.
//
// After a campaign proven first by a record (no read: tail is older than
// its predecessor's release), the guess is the next node of that
// predecessor's session (its next guid) at the sequence right below
// name's: the predecessor's requeue, when it was the last create before
// name.
func (s *session) predict(key, name string) (contender, bool) {
	seq, ok := parseSeq(name)
	if !ok {
		return contender{}, false
	}
	s.mu.Lock()
	k := s.keys[key]
	s.mu.Unlock()
	t := k.tail
	switch {
	case seq == t.max+1 && t.others >= minPredictOthers:
		return t.other, true
	case seq == t.max+2 && t.others >= minPredictOthers-1 && k.woke != "":
		// One child was created between: mostly the node that woke the
		// reader, queued again by its session after its release, while
		// the reader read the queue. If that session is tenure's, the
		// node's guid follows the one before (nextGUID) and its name is
		// known. It is the predecessor if it exists (no other node holds
		// that sequence); if not, WaitHead reads the queue.
		g := guidOf(k.woke)
		if g == "" {
			break
		}
		seq := t.max + 1
		return contender{name: protectedPrefix + nextGUID(g) + lockMarker + formatSeq(seq), seq: seq}, true
	case k.recorded && seq > 0 && seq <= maxRecordSeq:
		// The session's last campaign on key was proven first by a
		// handover record, without a read, so tail is older than its
		// predecessor's release. That predecessor's session, if tenure's,
		// queued again right after its release, under the next guid:
		// mostly the last create before this one (no new contender came
		// meanwhile), with the sequence right below name's.
		g := guidOf(k.woke)
		if g == "" {
			break
		}
		return contender{name: protectedPrefix + nextGUID(g) + lockMarker + formatSeq(seq-1), seq: seq - 1}, true
	}
	return contender{}, false
}

// formatSeq prints a sequence as ZooKeeper does ("%010d" of an int32).
func formatSeq(seq int64) string { return fmt.Sprintf("%010d", int32(seq)) }

// minPredictOthers is the fewest other contenders a read must show for
// predict to answer. With one other (two contenders), that other is the
// holder when the read is a new leader's, and mostly gone by the time the
// creator's watch of it arrives: a read right after the create then shows
// the node first one round trip sooner than the watch's failure and a
// read after it.
const minPredictOthers = 2

// takePredicted returns and forgets the predecessor Enqueue predicted for
// the node at p.
func (s *session) takePredicted(p string) (contender, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.predicted[p]
	delete(s.predicted, p)
	return c, ok
}

// lost explains why t's node is gone or not ours.
func (s *session) lost(t election.Ticket) error {
	if err := s.Err(); errors.Is(err, tenure.ErrClosed) {
		// Ended on this side (its Backend is closing): the node is
		// still the session's, for Close to delete.
		return err
	}
	s.forget(t.Name)
	if !s.alive() {
		return s.expired(fmt.Errorf("node %s went with the session", t.Name))
	}
	return fmt.Errorf("%w: zookeeper node %s (czxid %d) was deleted or is not the session's", tenure.ErrOwnershipLost, t.Name, t.Token)
}

// forget drops p from the session's records. When p was found after a
// create reply was lost, the other nodes of its guid, if any, are deleted
// in the background.
func (s *session) forget(p string) {
	s.mu.Lock()
	delete(s.nodes, p)
	delete(s.parked, p)
	delete(s.prefetched, p)
	delete(s.predicted, p)
	delete(s.heads, p)
	guid, unsure := s.unsure[p]
	delete(s.unsure, p)
	s.mu.Unlock()
	if unsure {
		s.b.reapGUID(path.Dir(p), guid)
	}
}

// Ahead counts the contenders before t.
func (s *session) Ahead(ctx context.Context, t election.Ticket) (int, error) {
	i, _, err := s.queue(ctx, t, nil)
	if err != nil {
		return 0, err
	}
	if i < 0 {
		return 0, s.lost(t)
	}
	return i, nil
}

// watch sets a watch on p; ok reports whether p exists. It reads p with
// GetW, not ExistsW: an exists watch on a missing node stays registered,
// on the client and the server, until that path is created, and a
// contender's name is never created again, so every predecessor that left
// between a queue read and its watch would leave a watch behind for the
// connection's life (sent again on every reconnection). A data watch is
// set only on a node that exists.
func (s *session) watch(ctx context.Context, p string) (<-chan zk.Event, *zk.Stat, bool, error) {
	type res struct {
		ok bool
		st *zk.Stat
		ch <-chan zk.Event
	}
	r, err := call(ctx, s.b, func() (res, error) {
		_, st, ch, err := s.b.conn.GetW(p)
		if errors.Is(err, zk.ErrNoNode) {
			return res{}, nil
		}
		return res{err == nil, st, ch}, err
	}, nil)
	if err != nil {
		return nil, nil, false, translate("watch "+p, err)
	}
	return r.ch, r.st, r.ok, nil
}

// watchChildren reads key's children and watches them for their next
// change.
func (s *session) watchChildren(ctx context.Context, key string) ([]string, <-chan zk.Event, error) {
	type res struct {
		children []string
		ch       <-chan zk.Event
	}
	r, err := call(ctx, s.b, func() (res, error) {
		c, _, ch, err := s.b.conn.ChildrenW(key)
		return res{c, ch}, err
	}, nil)
	if err != nil {
		return nil, nil, translate("watch children of "+key, err)
	}
	return r.children, r.ch, nil
}

// WaitHead implements election.Session. Tokens are set at Enqueue, so t
// comes back unchanged.
func (s *session) WaitHead(ctx context.Context, t election.Ticket) (election.Ticket, error) {
	return t, s.waitHead(ctx, t)
}

// waitHead waits until t is the lowest contender, watching only its
// predecessor (and its own node, when Enqueue had to read it and left a
// watch), and returns after a queue read made since the predecessor went
// shows t's node first. Transient failures are retried until ctx ends; a
// read of the queue that the key's ACL refuses is returned
// (tenure.ErrInvalidConfig). A predecessor whose ACL refuses this client
// (ZooKeeper then sends it no event of that node) is waited on through a
// watch of the queue's children instead.
//
// A waiter does not watch its own node (one request per handoff less): a
// waiter whose node was deleted learns it at its next wake-up, when the
// queue read shows the node gone, so it waits on, unaware, for as long as
// its predecessor stays. A node deleted after the read that shows it first
// (microseconds before this returns, or between Enqueue's read and this
// call) is found gone by WatchLoss, when it sets its watch.
func (s *session) waitHead(ctx context.Context, t election.Ticket) error {
	ownCh := s.takeWatch(t.Name) // when Enqueue read the node with a watch
	var read *[]string           // the queue read made by the last wake-up
	woke := ""                   // the predecessor whose watch fired last
	var keyRead *keyNode         // the key's node, read by the last wake-up (handover.go)
	// elected ends the wait of t, just shown first by a read of the queue
	// or, byRecord, by a handover record (n: the wake-up's read of the
	// key's node, if any).
	elected := func(n *keyNode, byRecord bool) error {
		if !s.alive() {
			return s.lost(t)
		}
		s.parkWatch(t.Name, ownCh)
		if woke != "" {
			s.updateKey(t.Key, func(k *keyState) { k.woke, k.recorded = woke, byRecord })
		}
		s.markHead(t, n)
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !s.alive() {
			return s.lost(t)
		}
		var (
			i      int
			before contender
			err    error
		)
		if pred, ok := s.takePredicted(t.Name); ok && read == nil {
			i, before = 1, pred // Enqueue knew it without a read (predict)
		} else {
			i, before, err = s.queue(ctx, t, read)
		}
		read = nil
		if err != nil {
			if errors.Is(err, tenure.ErrInvalidConfig) {
				return err // refused by the key's ACL: reading again will not help
			}
			if !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		if i < 0 {
			return s.lost(t)
		}
		if i == 0 {
			// This read shows the node. Its name (uuid and sequence) was
			// created by this session and is never reused, and an ephemeral
			// node outlives no session, so while the connection still runs
			// this session the node is this session's: ownership is proven
			// without another read.
			return elected(keyRead, false)
		}
		pred := path.Join(t.Key, before.name)
		if g := guidOf(before.name); g != "" && g == guidOf(path.Base(t.Name)) {
			// An earlier create of this same Enqueue, whose reply was lost
			// and which findByGUID missed: ours, and ahead of us. Delete it.
			_, err := call(ctx, s.b, func() (struct{}, error) {
				err := s.b.conn.Delete(pred, 0)
				if errors.Is(err, zk.ErrBadVersion) {
					// Another client wrote to it: it is still this
					// campaign's leftover, ahead of its node, and a
					// version-guarded delete would fail on every pass.
					err = s.b.conn.Delete(pred, -1)
				}
				return struct{}{}, err
			}, nil)
			if err != nil && !errors.Is(err, zk.ErrNoNode) && !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		var ok bool
		parkable := true // a data watch on pred (not the queue's)
		predCh := s.b.takePred(pred)
		if predCh != nil {
			ok = true // parked while pred stood; if it has gone since, the watch has fired
		} else {
			predCh, _, ok, err = s.watch(ctx, pred)
		}
		if errors.Is(err, tenure.ErrInvalidConfig) {
			parkable = false
			// The predecessor's ACL denies this client READ (another
			// digest user's node; Curator with a creator-only
			// ACLProvider): ZooKeeper neither answers a read of it nor
			// sends this client its events. Watch the queue itself:
			// every change of it wakes this waiter, which reads it again.
			var children []string
			children, predCh, err = s.watchChildren(ctx, t.Key)
			if errors.Is(err, tenure.ErrInvalidConfig) {
				return err
			}
			if err == nil {
				if _, b, found := position(children, path.Base(t.Name)); !found || b.name != before.name {
					read = &children // the queue changed since the last read
					continue
				}
				ok = true
			}
		}
		if err != nil {
			if !pause(ctx) {
				return ctx.Err()
			}
			continue
		}
		if !ok {
			continue // gone already: read the queue again
		}
		own := ""
		if parkable && s.useRecord(t) {
			own = t.Name
		}
		keyRead = nil
		w, err := s.wake(ctx, t.Key, own, predCh, ownCh)
		if !w.woke && parkable {
			s.b.parkPred(pred, predCh)
		}
		switch {
		case w.ended:
			return s.Err()
		case w.own:
			s.b.watchEvents.Add(1)
			ownCh = nil
			if w.ownEvent.Type == zk.EventNodeDeleted {
				return s.lost(t)
			}
		case !w.woke && err == nil: // ctx ended
			return ctx.Err()
		case err != nil:
			// The read after the event failed; or, woke false, the wait
			// never ran (the connection is closing): the next pass sees
			// the session's state. Never nil without a read that shows
			// the node first.
			if w.woke {
				s.b.watchEvents.Add(1)
			}
			if !pause(ctx) {
				return ctx.Err()
			}
		case w.node != nil:
			s.b.watchEvents.Add(1)
			woke = before.name
			if w.ownGone {
				return s.lost(t)
			}
			s.updateKey(t.Key, func(k *keyState) { k.size = w.node.size })
			if w.node.provesFirst(before.name) {
				return elected(w.node, true)
			}
			keyRead = w.node // no proof: the queue read of the next pass decides
		default:
			s.b.watchEvents.Add(1)
			read = &w.children
			woke = before.name
		}
	}
}

// woken is what ended one wait of waitHead.
type woken struct {
	woke     bool     // the predecessor's watch fired; then children, or node and ownGone
	children []string // the queue, read after that event (unless err, or node)
	node     *keyNode // the key's node, read after that event instead of the queue (handover.go)
	ownGone  bool     // with node: t's own node was found gone
	own      bool     // the watch on t's own node fired first
	ownEvent zk.Event
	ended    bool // the session ended first
}

// wake waits for the predecessor's watch event, then reads key's
// children, or, when own (t's node) is not "", the key's node and whether
// own exists, the two requests sent together (handover.go). The wait and
// the read run in one goroutine, started before the wait: the event
// starts the read at once, as in go-zookeeper's own Lock, not after a
// goroutine hand-off. The wait ends early, with nothing read, on an event
// of ownCh (t's own node, when Enqueue left a watch on it), the session's
// end or ctx's (woke false and no own or ended: ctx ended).
func (s *session) wake(ctx context.Context, key, own string, predCh, ownCh <-chan zk.Event) (woken, error) {
	w, err := call(ctx, s.b, func() (woken, error) {
		select {
		case <-predCh:
		case ev := <-ownCh:
			return woken{own: true, ownEvent: ev}, nil
		case <-s.Done():
			return woken{ended: true}, nil
		case <-ctx.Done():
			return woken{}, ctx.Err()
		}
		if own != "" {
			return s.readRecord(key, own, ownCh)
		}
		children, _, err := s.b.conn.Children(key)
		if errors.Is(err, zk.ErrNoNode) {
			children, err = nil, nil // no key, so no node of ours: the queue is empty
		}
		return woken{woke: true, children: children}, translate("children of "+key, err)
	}, nil)
	if ctx.Err() != nil && !w.ended && !w.own {
		return woken{}, ctx.Err()
	}
	return w, err
}

// lossWatchDelay is how long after WatchLoss starts it sets its first
// watch on the node, when WaitHead handed over none. A term that ends
// sooner (a lock held for a moment) costs no request for the watch; a node
// deleted sooner is found missing when the watch is set, at most this much
// (and one round trip) later than a watch set at once would have told.
const lossWatchDelay = 10 * time.Millisecond

// WatchLoss waits until t's node is deleted, changes owner, or its session
// ends.
func (s *session) WatchLoss(ctx context.Context, t election.Ticket) error {
	// The watch WaitHead handed over, if any, was set while the node
	// existed; later watches are set here, each after checking the node.
	ch := s.takeWatch(t.Name)
	if ch == nil {
		// The wait runs on a small stack frame: most short terms end
		// here, on the new goroutine the elector runs this on, before its
		// stack has had to grow for watchLoss.
		d := time.NewTimer(lossWatchDelay)
		select {
		case <-d.C:
		case <-s.Done():
			d.Stop()
			return s.lost(t)
		case <-ctx.Done():
			d.Stop()
			return ctx.Err()
		}
	}
	return s.watchLoss(ctx, t, ch)
}

// watchLoss is WatchLoss once its first watch is set (ch) or due (nil).
func (s *session) watchLoss(ctx context.Context, t election.Ticket, ch <-chan zk.Event) error {
	for {
		if ch == nil {
			if ctx.Err() != nil { // resigned before the watcher got here
				return ctx.Err()
			}
			w, st, ok, err := s.watch(ctx, t.Name)
			if err == nil && (!ok || uint64(st.Czxid) != t.Token || st.EphemeralOwner != s.id) {
				return s.lost(t)
			}
			if err == nil && st.Version != 0 {
				// Someone changed the node's data (tenure never does):
				// zkfence refuses its holder's writes from then on, and a
				// leader that cannot write must not hold the key. The
				// node is still t's; it goes in the background, and the
				// next candidate leads.
				s.forget(t.Name)
				s.b.reap(s.id, t.Name, t.Token)
				return fmt.Errorf("%w: zookeeper node %s (czxid %d) was changed by another client (version %d): zkfence refuses its holder's writes", tenure.ErrOwnershipLost, t.Name, t.Token, st.Version)
			}
			if err != nil {
				if errors.Is(err, tenure.ErrSessionExpired) || !s.alive() {
					return s.lost(t)
				}
				if !pause(ctx) {
					return ctx.Err()
				}
				continue
			}
			ch = w
		}
		select {
		case ev := <-ch:
			s.b.watchEvents.Add(1)
			if ev.Type == zk.EventNodeDeleted || !s.alive() {
				return s.lost(t)
			}
			ch = nil // a one-shot watch: set it again
		case <-s.Done():
			return s.lost(t)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Dequeue deletes t's node if it still has t's czxid, guarded by its
// version. When t was proven first in a long queue, the same multi records
// the handover (handover.go); when that multi fails, the node is deleted
// alone.
func (s *session) Dequeue(ctx context.Context, t election.Ticket) error {
	s.takeWatch(t.Name)
	if v, ok := s.takeHead(t); ok && s.releaseRecorded(ctx, t, v) {
		s.forget(t.Name)
		return nil
	}
	// tenure never changes its nodes, and a name is never reused: a node at
	// t's path with version 0 is t's.
	_, err := call(ctx, s.b, func() (struct{}, error) {
		return struct{}{}, s.b.conn.Delete(t.Name, 0)
	}, nil)
	switch {
	case err == nil, errors.Is(err, zk.ErrNoNode):
		s.forget(t.Name)
		return nil
	case !errors.Is(err, zk.ErrBadVersion):
		return translate("delete "+t.Name, err)
	}
	for { // someone changed the node's data: check its czxid, then delete
		st, ok, err := s.stat(ctx, t.Name)
		if err != nil {
			return err
		}
		if !ok || uint64(st.Czxid) != t.Token {
			s.forget(t.Name)
			return nil
		}
		_, err = call(ctx, s.b, func() (struct{}, error) {
			return struct{}{}, s.b.conn.Delete(t.Name, st.Version)
		}, nil)
		switch {
		case err == nil, errors.Is(err, zk.ErrNoNode):
			s.forget(t.Name)
			return nil
		case errors.Is(err, zk.ErrBadVersion):
			continue
		default:
			return translate("delete "+t.Name, err)
		}
	}
}

const retryPause = 50 * time.Millisecond

// retry runs f until it succeeds, fails for a reason other than
// tenure.ErrUnavailable (a connection being re-established), or ctx ends.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || !errors.Is(err, tenure.ErrUnavailable) || !pause(ctx) {
			return err
		}
	}
}

func pause(ctx context.Context) bool {
	t := time.NewTimer(retryPause)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// A wait that gives up (its ctx ended) leaves its watch on the predecessor
// behind: go-zookeeper cannot remove a watch, and keeps every channel it
// handed out for a node until the node changes. A waiter that gives up
// again and again behind the same holder (Mutex.Lock with a deadline, in a
// loop, behind a term of days) would add one channel for each try. The
// Backend parks the watch a wait gave up instead, for the next wait on the
// same node to take. A go-zookeeper watch channel gets one event and is
// closed: a parked one that has fired is dropped at the next park.

// parkPred keeps ch, the watch on predecessor p of a wait that gave up
// before it fired, for the next wait on p (takePred). When one is parked
// for p already, ch stays with go-zookeeper until p changes.
func (b *Backend) parkPred(p string, ch <-chan zk.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for q, c := range b.preds { // drop the ones that fired: their nodes changed
		select {
		case <-c:
			delete(b.preds, q)
		default:
		}
	}
	if _, ok := b.preds[p]; !ok {
		b.preds[p] = ch
	}
}

// takePred returns and forgets the watch parked for predecessor p, or nil.
func (b *Backend) takePred(p string) <-chan zk.Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := b.preds[p]
	delete(b.preds, p)
	return ch
}

// parkWatch keeps ch, a watch on node p, for the next WaitHead or
// WatchLoss of the same node.
func (s *session) parkWatch(p string, ch <-chan zk.Event) {
	if ch == nil {
		return
	}
	s.mu.Lock()
	s.parked[p] = ch
	s.mu.Unlock()
}

// takeWatch returns and forgets the watch parked for node p, or nil.
func (s *session) takeWatch(p string) <-chan zk.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := s.parked[p]
	delete(s.parked, p)
	return ch
}
