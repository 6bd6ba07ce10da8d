package etcdelect

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// OpenSession grants a lease of opts.TTL and renews it every
// opts.RenewInterval with one KeepAliveOnce each, reporting the send time of
// every acknowledged renewal. When the server grants a different TTL than
// asked (its minimum lease TTL is higher), it revokes the lease and fails
// with tenure.ErrInvalidConfig.
func (b *Backend) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	if err := b.usable(); err != nil {
		return nil, err
	}
	if err := b.CheckTTL(opts.TTL); err != nil {
		return nil, err
	}
	if opts.RenewInterval <= 0 || opts.RenewInterval >= opts.TTL {
		return nil, fmt.Errorf("%w: etcd: RenewInterval %v must be positive and below the TTL %v", tenure.ErrInvalidConfig, opts.RenewInterval, opts.TTL)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	want := int64(opts.TTL / time.Second)
	sent := opts.Now()
	resp, err := b.cli.Grant(ctx, want)
	if err != nil {
		return nil, translate("grant", err)
	}
	if resp.TTL != want {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opts.TTL)
		defer cancel()
		_, _ = b.cli.Revoke(rctx, resp.ID)
		return nil, fmt.Errorf("%w: etcd granted a %ds lease for the %ds asked: the server's minimum lease TTL is above the TTL", tenure.ErrInvalidConfig, resp.TTL, want)
	}
	s := &session{
		cli: b.cli, id: resp.ID, opts: opts, handover: b.handover, streams: &b.streams,
		granted:  election.Renewal{Sent: sent, TTL: time.Duration(resp.TTL) * time.Second},
		loopDone: make(chan struct{}),
	}
	s.renewed = s.granted
	s.Init()
	s.ctx, s.stop = context.WithCancel(context.Background())
	go s.keepAlive()
	return s, nil
}

// session is one etcd lease and the entries attached to it.
type session struct {
	cli     *clientv3.Client
	id      clientv3.LeaseID
	opts    election.SessionOptions
	granted election.Renewal

	election.SessionSignals

	ownMu  sync.Mutex
	owns   map[string]*ownWatch // by entry name, kept across campaigns
	proved *ownWatch            // the watch WaitHead's last read came after
	proven uint64               // the ticket that read showed
	// foreign are keys that look like entries but are not attached to
	// their lease (another client's data), by name, with their create
	// revision.
	foreign map[string]int64
	// heads are this session's entries proven first in a queue of at
	// least handover keys, by name, with their token: releasing one
	// records the handover (see handover.go).
	heads    map[string]uint64
	handover int64 // the Backend's WithHandoverRecords; 0: never
	// noHandover is set once the server refused a handover record (a role
	// without permission on it): releases delete only from then on.
	noHandover atomic.Bool

	ctx      context.Context // ends at Close
	stop     context.CancelFunc
	loopDone chan struct{}

	renewMu sync.Mutex
	renewed election.Renewal // the latest acknowledged renewal (the grant at first)

	streams   *atomic.Uint64 // the Backend's watch stream number (watchCtx)
	suspectMu sync.Mutex
	suspectCh chan struct{} // closed at the next suspicion (see suspicion)
	// slowBound is bound's current value once a bounded request has timed
	// out (0 before): doubled at each timeout up to the TTL, and back to
	// the start at the next request answered in time.
	slowBound atomic.Int64
}

// suspicion returns a channel closed the next time a renewal's second
// request answers while its first, unanswered for half the interval,
// still waits: the client may have a connection that went silent (no
// reset), where a watch's stream would never deliver.
func (s *session) suspicion() <-chan struct{} {
	s.suspectMu.Lock()
	defer s.suspectMu.Unlock()
	if s.suspectCh == nil {
		s.suspectCh = make(chan struct{})
	}
	return s.suspectCh
}

// suspect closes the channel suspicion returned.
func (s *session) suspect() {
	s.suspectMu.Lock()
	defer s.suspectMu.Unlock()
	if s.suspectCh != nil {
		close(s.suspectCh)
		s.suspectCh = nil
	}
}

// watchCtx is ctx for a watch on stream n (s.streams): etcd's client
// sends every watch whose ctx has the same metadata on one gRPC stream,
// over one connection. Once a stream was found silent (silentStream),
// watches carry the stream's number, so that they start a stream of their
// own, on the connection the client's balancer picks next.
func (s *session) watchCtx(ctx context.Context, n uint64) context.Context {
	if n > 0 {
		return metadata.AppendToOutgoingContext(ctx, streamKey, strconv.FormatUint(n, 10))
	}
	return ctx
}

// silentStream moves the watches made from now on to a new stream, once
// per stream found silent (n is the number the watch was made with).
func (s *session) silentStream(n uint64) { s.streams.CompareAndSwap(n, n+1) }

// streamKey is the metadata that numbers tenure's watch streams.
const streamKey = "tenure-watch-stream"

// bound is how long a waiting candidate's read, or a watch's creation,
// may take before it is given up and tried again, 0 for no bound: on a
// connection that went silent it would otherwise wait for good, and the
// client's balancer sends the next try on its next connection. With one
// endpoint there is no other connection, and no bound. It starts at
// max(RenewInterval, 1 s) and doubles at each timeout (timedOut) up to the
// TTL, so that a server that is slow, not silent, is waited for.
func (s *session) bound() time.Duration {
	if len(s.cli.Endpoints()) < 2 {
		return 0
	}
	if b := s.slowBound.Load(); b > 0 {
		return time.Duration(b)
	}
	return max(s.opts.RenewInterval, time.Second)
}

// timedOut doubles the bound (up to the TTL) after a request over it,
// and inTime resets it after one within it.
func (s *session) timedOut(b time.Duration) {
	s.slowBound.Store(int64(min(2*b, max(s.opts.TTL, b))))
}

func (s *session) inTime() { s.slowBound.Store(0) }

// surelyLive reports whether the lease cannot have expired on the server
// yet: its latest acknowledged renewal, counted from before it was sent,
// has time left on the local clock.
func (s *session) surelyLive() bool {
	s.renewMu.Lock()
	r := s.renewed
	s.renewMu.Unlock()
	return s.opts.Now().Before(r.Sent.Add(r.TTL))
}

func (s *session) Granted() election.Renewal { return s.granted }

func (s *session) expired(cause error) error {
	err := fmt.Errorf("%w: etcd lease %x: %w", tenure.ErrSessionExpired, int64(s.id), cause)
	s.End(err)
	return err
}

// keepAlive renews the lease every RenewInterval; after a failed attempt it
// retries four times as often, so a short outage costs little of the
// deadline.
func (s *session) keepAlive() {
	defer close(s.loopDone)
	every := s.opts.RenewInterval
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		resp, sent, told, err := s.renew(every)
		switch {
		case s.ctx.Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.expired(err)
			return
		case err != nil:
			if !told {
				s.Push(election.Renewal{Err: translate("keepalive", err)})
			}
			t.Reset(every / 4)
			continue
		}
		r := election.Renewal{Sent: sent, TTL: time.Duration(resp.TTL) * time.Second}
		s.renewMu.Lock()
		if r.Sent.After(s.renewed.Sent) {
			s.renewed = r
		}
		s.renewMu.Unlock()
		s.Push(r)
		t.Reset(every)
	}
}

// renew sends one keep-alive, bounded by every. When it has no answer
// after every/2, it sends a second one beside it, which the client's
// balancer sends on another connection: a member that holds the first
// (partitioned from its peers, it waits for a raft leader, while the
// client still reaches it) would otherwise take the whole attempt, and
// the retry a quarter later could come after the deadline (at
// DeadlineMargin + 2·RenewInterval = TTL, Validate's limit, it does). The
// first answer counts, with the send time of the request it answers; the
// other request is cancelled. A failure is returned once no request is
// left that could still answer; the first one's, when the second may still
// answer, is pushed at once (told: the round's failure is reported).
func (s *session) renew(every time.Duration) (resp *clientv3.LeaseKeepAliveResponse, sent time.Time, told bool, err error) {
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: the other request ends at once
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	type result struct {
		resp   *clientv3.LeaseKeepAliveResponse
		sent   time.Time
		err    error
		second bool // the hedge's
	}
	results := make(chan result, 2) // never blocks
	send := func(second bool) func() {
		return func() {
			sent := s.opts.Now()
			actx, acancel := context.WithTimeout(ctx, every)
			defer acancel()
			resp, err := s.cli.KeepAliveOnce(actx, s.id)
			results <- result{resp, sent, err, second}
		}
	}
	wg.Go(send(false))
	hedge := time.NewTimer(every / 2)
	defer hedge.Stop()
	pending, hedged := 1, false
	var last result
	for pending > 0 {
		select {
		case <-hedge.C:
			hedged = true
			pending++
			wg.Go(send(true))
		case r := <-results:
			pending--
			if r.second && r.err == nil && pending > 0 {
				// The second request, on another connection, answered
				// while the first still waits: its connection may have
				// gone silent (a slow server would answer the first
				// first). Waiters check their watches' streams.
				s.suspect()
			}
			if r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
				return r.resp, r.sent, told, r.err
			}
			last = r
			if !hedged { // a quick failure: the caller retries soon
				return nil, r.sent, told, r.err
			}
			if pending > 0 && !told && s.ctx.Err() == nil {
				// The first request failed (timed out) while the second
				// may still answer: say so now, as without the second
				// (the elector suspends the term until an answer).
				s.Push(election.Renewal{Err: translate("keepalive", r.err)})
				told = true
			}
		}
	}
	return nil, last.sent, told, last.err
}

// ended returns why the session ended once Close or abandon has begun, and
// nil before: the watches on its entries run on its context, so a wait
// that went on would retry a watch that can no longer start, until its
// caller's context ended.
func (s *session) ended() error {
	if s.ctx.Err() == nil {
		return nil
	}
	if err := s.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: etcd session %x is closing", tenure.ErrClosed, int64(s.id))
}

// Close stops renewals and revokes the lease, deleting its entries.
func (s *session) Close(ctx context.Context) error {
	s.stop()
	<-s.loopDone
	defer s.End(tenure.ErrClosed)
	if _, err := s.cli.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return translate("revoke", err)
	}
	return nil
}

// lost explains why t's entry disappeared: its lease is gone (the session
// expired or was revoked) or someone else deleted it.
//
// etcd reports a lease's time to live in whole seconds, truncated, and -1
// for a lease it does not have: 0 is a lease with less than a second left,
// or one expired less than a second ago and not revoked yet. So 0 means
// expired only when the session's own renewals cannot show the lease live.
func (s *session) lost(ctx context.Context, t election.Ticket) error {
	ctx, cancel := s.bounded(ctx) // an unanswered read says ownership lost
	defer cancel()
	resp, err := s.cli.TimeToLive(ctx, s.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && (resp.TTL < 0 || resp.TTL == 0 && !s.surelyLive()) {
		return s.expired(fmt.Errorf("entry %s deleted with its lease", t.Name))
	}
	return fmt.Errorf("%w: etcd entry %s (revision %d) was deleted, replaced or detached from the session's lease", tenure.ErrOwnershipLost, t.Name, t.Token)
}
