package election

import (
	"context"
	"time"

	"github.com/tenure-go/tenure"
)

// Backend is a store that elections run on. A Backend value is one client of
// the store, as one process would have: sessions it opens are independent of
// other Backend values' sessions. Implementations must be safe for
// concurrent use and must translate their failures into tenure's sentinel
// errors (tenure.ErrSessionExpired, tenure.ErrOwnershipLost,
// tenure.ErrUnavailable, tenure.ErrInvalidConfig), keeping the cause
// reachable with %w.
type Backend interface {
	// Name names the backend in terms, logs and metrics, e.g. "etcd".
	Name() string
	// Linearizable reports whether the backend's tokens are fencing tokens
	// (every new leader's token is larger than every earlier leader's).
	Linearizable() bool
	// CheckKey returns an error wrapping tenure.ErrInvalidConfig when key is
	// not a valid election key for this backend.
	CheckKey(key string) error
	// CheckTTL returns an error wrapping tenure.ErrInvalidConfig when the
	// backend cannot honour ttl exactly.
	CheckTTL(ttl time.Duration) error
	// OpenSession starts a session: a lease of opts.TTL that the backend
	// renews every opts.RenewInterval until the session is closed or lost.
	OpenSession(ctx context.Context, opts SessionOptions) (Session, error)
	// Leader reads the current leader of key, or a vacancy.
	Leader(ctx context.Context, key string) (tenure.Leader, error)
	// Observe calls emit with the leader of key (vacancy included) now and
	// after every change, until ctx ends or the backend fails. It may emit
	// the same leader twice. It returns ctx.Err() when ctx ends.
	Observe(ctx context.Context, key string, emit func(tenure.Leader)) error
}

// SessionOptions configure Backend.OpenSession. TTL and RenewInterval have
// no default (the Elector fills them from its Config); a nil Now means
// time.Now. A plain value: OpenSession reads it once.
type SessionOptions struct {
	// TTL is the lease's time to live on the server.
	TTL time.Duration
	// RenewInterval is how often the backend renews the lease.
	RenewInterval time.Duration
	// DeadlineMargin is how long before the server could expire the lease
	// the elector stops trusting it (Config.DeadlineMargin); 0 when not
	// known. A backend whose renewals count from before they were sent
	// may refuse a margin that leaves no room between them.
	DeadlineMargin time.Duration
	// Now reads the local clock for Renewal.Sent. It must return times that
	// carry a monotonic reading (time.Now does).
	Now func() time.Time
}

// Renewal is the outcome of one attempt to renew a session's lease. A plain
// value, safe to copy and to send between goroutines.
type Renewal struct {
	// Sent is a local time no later than the instant from which the server
	// counts TTL: usually when the renewal request was sent, read before
	// sending. A backend whose server may learn of the renewal later than
	// it answers it reports an earlier time (zkelect: a ZooKeeper leader
	// server learns of a follower's clients from the follower's pings).
	Sent time.Time
	// TTL is the time to live the server granted from that request on.
	TTL time.Duration
	// Err is non-nil when the attempt failed without proving the session
	// dead (timeout, lost connection). Sent and TTL are then meaningless.
	Err error
}

// Ticket is a candidate's entry in a key's queue. A plain value, safe to
// copy; a Session is what is shared.
type Ticket struct {
	// Key is the election key.
	Key string
	// Identity is the candidate's identity, stored in the entry.
	Identity string
	// Token orders the queue and is the term's fencing token when the entry
	// leads. Backends that issue tokens at the head (see Session.WaitHead)
	// leave it 0 until then.
	Token uint64
	// Name is the backend's own name for the entry (etcd key, znode path).
	Name string
}

// Session is a backend session: a lease under which a candidate's entries
// live. Implementations must be safe for concurrent use.
type Session interface {
	// Granted is the renewal that created the session.
	Granted() Renewal
	// Renewals delivers the outcome of each later renewal attempt. The
	// channel is buffered; when its reader lags, older outcomes are
	// replaced by newer ones (latest wins). It is never closed.
	Renewals() <-chan Renewal
	// Done is closed when the session has ended for good: expired on the
	// server, revoked, or closed.
	Done() <-chan struct{}
	// Err reports why Done was closed (wrapping tenure.ErrSessionExpired or
	// tenure.ErrClosed), or nil while the session lives.
	Err() error

	// Enqueue creates this session's entry under key, or returns the one it
	// already has. On error it leaves no entry behind.
	Enqueue(ctx context.Context, key, identity string) (Ticket, error)
	// Ahead returns how many entries precede t in its key's queue. It fails
	// with tenure.ErrOwnershipLost when t's entry is gone.
	Ahead(ctx context.Context, t Ticket) (int, error)
	// WaitHead blocks until t is the first entry of its key's queue, then
	// returns after a read that shows t's entry still exists under this
	// session. It returns t, with its Token set when the backend issues
	// tokens only at the head (Redis: a token taken at arrival could be
	// lower than that of a later arrival that acquired first); backends
	// that set the token at Enqueue return t unchanged. It fails with
	// tenure.ErrOwnershipLost or tenure.ErrSessionExpired when the entry is
	// lost while waiting; a backend may notice a lost entry only when it
	// next reads the queue (ZooKeeper: when the predecessor goes), but
	// never returns nil after a read that does not show it.
	WaitHead(ctx context.Context, t Ticket) (Ticket, error)
	// WatchLoss blocks until t's entry is deleted or no longer belongs to
	// this session, and returns why (tenure.ErrOwnershipLost or
	// tenure.ErrSessionExpired), or ctx.Err() when ctx ends first.
	WatchLoss(ctx context.Context, t Ticket) error
	// Dequeue deletes t's entry if it is still t's (guarded by its token).
	// Deleting an entry that is already gone succeeds.
	Dequeue(ctx context.Context, t Ticket) error
	// Close stops renewals and ends the session on the server, releasing
	// every entry held under it. It is idempotent.
	Close(ctx context.Context) error
}
