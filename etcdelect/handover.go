package etcdelect

import (
	"context"
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure/election"
)

// A handover record lets the next waiter prove itself first without
// reading the queue.
//
// Proving "no entry older than mine" takes a range over the whole prefix:
// etcd has no index by create revision, so any range that filters or sorts
// by it visits every key (see read). On a long queue that range is most of
// a handoff's server time, and it grows with the queue. But a waiter W
// whose predecessor P was proven first needs no range when P's entry goes:
// entries are ordered by create revision and a new one is always newer
// than every existing one, so none older than P can appear after P was
// proven first, and none between P and W after W's read found P as its
// predecessor. When P is deleted, W is first, if P was deleted as a proven
// head.
//
// So a session releasing an entry it proved first deletes it and, in the
// same transaction, puts "<key>.tenure-released" = "<token> <entry name>"
// under its own lease (gone with the session). W, woken by P's delete at
// revision R, reads that record together with its own entry: written at R
// and naming P's token and name, it is the proof. Anything else (P
// abandoned its wait, its lease expired, P is another client such as
// etcdctl, the record was overwritten or refused) sends W to the range.
//
// Only queues long enough for the range to cost use it: a session records
// a handover only for an entry whose proof read saw at least 32 keys under
// the prefix (WithHandoverRecords), and a waiter looks for one only when
// its own last read saw as many. On short queues nothing changes, and no
// record is left behind when the last of a few candidates resigns.

// defaultHandoverQueue is WithHandoverRecords' default.
const defaultHandoverQueue = 32

// handoverSuffix names a key's handover record: "<key>.tenure-released",
// outside the "<key>/" prefix that etcdctl lock and elect treat as the
// queue.
const handoverSuffix = ".tenure-released"

func handoverName(key string) string { return key + handoverSuffix }

// handoverValue names the released entry: its token and its name.
func handoverValue(token int64, name []byte) string {
	return strconv.FormatInt(token, 10) + " " + string(name)
}

// handoverOn reports whether a queue of size keys uses handover records:
// on, at or above WithHandoverRecords' length, and not refused.
func (s *session) handoverOn(size int64) bool {
	return s.handover > 0 && size >= s.handover && !s.noHandover.Load()
}

// markHead records t, just proven first in a queue of size keys, so that
// its release records the handover.
func (s *session) markHead(t election.Ticket, size int64) {
	if !s.handoverOn(size) {
		return
	}
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if s.heads == nil {
		s.heads = map[string]uint64{}
	}
	s.heads[t.Name] = t.Token
}

// takeHead reports whether t was recorded by markHead, and forgets it.
func (s *session) takeHead(t election.Ticket) bool {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	tok, ok := s.heads[t.Name]
	if ok {
		delete(s.heads, t.Name)
	}
	return ok && tok == t.Token
}

// Dequeue deletes t's entry if its create revision is still t's. When t was
// proven first in a long queue, the same transaction records the handover.
// A record the server refuses (permission denied: the role does not cover
// "<key>.tenure-released"; the session's lease is gone) is given up, for
// good after a refusal, and the entry deleted alone.
func (s *session) Dequeue(ctx context.Context, t election.Ticket) error {
	guard := clientv3.Compare(clientv3.CreateRevision(t.Name), "=", int64(t.Token))
	if s.takeHead(t) && !s.noHandover.Load() {
		_, err := s.cli.Txn(ctx).If(guard).
			Then(
				clientv3.OpDelete(t.Name),
				clientv3.OpPut(handoverName(t.Key), handoverValue(int64(t.Token), []byte(t.Name)), clientv3.WithLease(s.id)),
			).
			Commit()
		if err == nil {
			return nil
		}
		if refused(err) {
			s.noHandover.Store(true)
		}
		if ctx.Err() != nil {
			return translate("dequeue", err)
		}
		// Refused, or of unknown outcome: the guarded delete alone is
		// safe to send either way.
	}
	_, err := s.cli.Txn(ctx).If(guard).Then(clientv3.OpDelete(t.Name)).Commit()
	return translate("dequeue", err)
}

// readHandover reads t's own entry and the handover record of t's key, from
// the connected member's store once it has reached minRev (as read does:
// otherwise, or with minRev 0, linearizably). pred is t's predecessor, whose
// delete at revision delRev woke t. decided is false when the record does
// not show pred released as a proven head at delRev: the caller reads the
// queue. Otherwise own is t's entry (nil when gone: t lost it), and t is
// first.
func (s *session) readHandover(ctx context.Context, t election.Ticket, pred *mvccpb.KeyValue, delRev, minRev int64) (own *mvccpb.KeyValue, decided bool, err error) {
	ownOpts := []clientv3.OpOption{clientv3.WithKeysOnly()}
	var recOpts []clientv3.OpOption
	if minRev > 0 {
		ownOpts = append(ownOpts, clientv3.WithSerializable())
		recOpts = append(recOpts, clientv3.WithSerializable())
	}
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(t.Name, ownOpts...),
		clientv3.OpGet(handoverName(t.Key), recOpts...),
	).Commit()
	if err != nil {
		return nil, false, translate("read handover", err)
	}
	if minRev > 0 && resp.Header.Revision < minRev {
		// The member lags what the watch showed (etcd tells watchers of
		// a write before its readers see it, even on one member): agree
		// first.
		return s.readHandover(ctx, t, pred, delRev, 0)
	}
	own, err = s.ownEntry(ctx, t, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision)
	if err != nil || own == nil {
		return nil, err == nil, err
	}
	rec := resp.Responses[1].GetResponseRange().Kvs
	if len(rec) != 1 || rec[0].ModRevision != delRev || string(rec[0].Value) != handoverValue(pred.CreateRevision, pred.Key) {
		return nil, false, nil
	}
	return own, true, nil
}
