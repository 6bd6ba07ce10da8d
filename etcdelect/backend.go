package etcdelect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Name is the backend's name in terms, logs and metrics.
const Name = "etcd"

// MaxKeyLen is the longest election key accepted, in bytes.
const MaxKeyLen = 1024

// Backend is an election.Backend on one etcd client. It is safe for
// concurrent use. It does not own the client.
type Backend struct {
	cli      *clientv3.Client
	handover int64 // WithHandoverRecords' queue length; 0: never
	// streams numbers the gRPC stream the backend's watches go on
	// (watchCtx): moved on when one is found silent.
	streams atomic.Uint64
}

var _ election.Backend = (*Backend)(nil)

// An Option configures a Backend (New).
type Option func(*Backend)

// WithHandoverRecords sets the queue length, in keys under the election
// key's prefix, from which a resigning head records the handover
// ("<key>.tenure-released") and its successor reads that record instead of
// the queue (docs/etcd.md). Default 32. 1 uses records on every queue; 0 or
// less, on none: the backend then writes nothing outside "<key>/".
func WithHandoverRecords(minQueue int) Option {
	return func(b *Backend) { b.handover = int64(max(minQueue, 0)) }
}

// New returns a Backend on cli. Give cli gRPC keepalive pings
// (clientv3.Config's DialKeepAliveTime, 10 s, and DialKeepAliveTimeout):
// without them, the client never finds dead a connection to an endpoint
// that went silent (a dropped route: no reset). A waiting candidate copes
// with one (bounded reads, and a new watch stream when its own does not
// answer), but the client keeps sending every other request there (see
// docs/etcd.md).
func New(cli *clientv3.Client, opts ...Option) *Backend {
	b := &Backend{cli: cli, handover: defaultHandoverQueue}
	for _, o := range opts {
		if o != nil {
			o(b)
		}
	}
	return b
}

// Client returns the client the backend uses.
func (b *Backend) Client() *clientv3.Client { return b.cli }

// Name returns "etcd".
func (b *Backend) Name() string { return Name }

// Linearizable returns true.
func (b *Backend) Linearizable() bool { return true }

// errNoClient is what every call of a Backend made with a nil client
// returns (New cannot: it returns no error).
var errNoClient = fmt.Errorf("%w: etcd: nil client (etcdelect.New(nil))", tenure.ErrInvalidConfig)

// usable refuses a nil client, and a closed one at once (clientv3 takes
// about 2.5 s to fail each request on a closed client).
func (b *Backend) usable() error {
	if b.cli == nil {
		return errNoClient
	}
	if b.cli.Ctx().Err() != nil {
		return fmt.Errorf("%w: etcd: the client is closed", tenure.ErrClosed)
	}
	return nil
}

// CheckKey refuses empty keys, keys that are not valid UTF-8 or hold NUL or
// control characters, and keys longer than MaxKeyLen; and, with a nil
// client, every other key too.
func (b *Backend) CheckKey(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	if b.cli == nil {
		return errNoClient
	}
	return nil
}

// CheckKey refuses what Backend.CheckKey refuses for any client: empty
// keys, keys that are not valid UTF-8 or hold NUL or control characters,
// and keys longer than MaxKeyLen.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: etcd: empty key", tenure.ErrInvalidConfig)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: etcd: key is %d bytes, longer than %d", tenure.ErrInvalidConfig, len(key), MaxKeyLen)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: etcd: key %q is not valid UTF-8", tenure.ErrInvalidConfig, key)
	case strings.IndexFunc(key, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return fmt.Errorf("%w: etcd: key %q holds a control character", tenure.ErrInvalidConfig, key)
	}
	return nil
}

// MaxTTL is the longest lease etcd grants: 9,000,000,000 seconds (its
// lease.MaxLeaseTTL). A server refuses a longer one with "too large lease
// TTL".
const MaxTTL = 9_000_000_000 * time.Second

// CheckTTL refuses TTLs that are not a whole number of seconds from one
// to MaxTTL: etcd leases count whole seconds. The server may refuse more
// (its minimum TTL grows with its election timeout); OpenSession reports
// that.
func (b *Backend) CheckTTL(ttl time.Duration) error {
	if ttl < time.Second || ttl%time.Second != 0 {
		return fmt.Errorf("%w: etcd: TTL %v: etcd leases take whole seconds, at least 1s", tenure.ErrInvalidConfig, ttl)
	}
	if ttl > MaxTTL {
		return fmt.Errorf("%w: etcd: TTL %v is longer than etcd's longest lease, %v", tenure.ErrInvalidConfig, ttl, MaxTTL)
	}
	return nil
}

func prefix(key string) string { return key + "/" }

func entryName(key string, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s%x", prefix(key), int64(lease))
}

// translate maps an etcd client error onto tenure's sentinels, keeping it
// reachable. Context errors pass through unchanged; a closed client is
// tenure.ErrClosed; authentication and permission failures wrap
// tenure.ErrInvalidConfig (not retried); the rest wrap
// tenure.ErrUnavailable.
func translate(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return fmt.Errorf("%w: etcd %s: %w", tenure.ErrSessionExpired, op, err)
	case clientClosed(err):
		// The program closed the client: retrying cannot help.
		return fmt.Errorf("%w: etcd %s: the client is closed: %w", tenure.ErrClosed, op, err)
	case refused(err):
		// Retrying will not help: the credentials or the role are wrong.
		return fmt.Errorf("%w: etcd %s refused: %w (check the user's role: see docs/security.md)", tenure.ErrInvalidConfig, op, err)
	case tooLarge(err):
		// Nor here: the request (a long Identity, say) is over the
		// client's or the server's size limit.
		return fmt.Errorf("%w: etcd %s: the request is too large (a long Identity?): %w", tenure.ErrInvalidConfig, op, err)
	default:
		return fmt.Errorf("%w: etcd %s: %w", tenure.ErrUnavailable, op, err)
	}
}

// Leader reads the oldest entry of key. Keys under "<key>/" that are not
// entries (nested keys' entries "<key>/<sub>/…", keys without the lease
// their name says) are not contenders and are skipped.
func (b *Backend) Leader(ctx context.Context, key string) (tenure.Leader, error) {
	if err := b.usable(); err != nil {
		return tenure.Leader{}, err
	}
	// On a member cut off from the cluster's leader, the read fails once
	// the client's retries of "no leader" give up (about 2.5 s), instead
	// of holding until ctx ends.
	ctx = clientv3.WithRequireLeader(ctx)
	resp, err := b.cli.Get(ctx, prefix(key), clientv3.WithFirstCreate()...)
	if err != nil {
		return tenure.Leader{}, translate("get leader", err)
	}
	if len(resp.Kvs) == 0 || isEntry(key, resp.Kvs[0]) {
		return leaderOf(key, resp.Kvs), nil
	}
	// The oldest key under the prefix is not a contender (a nested key's
	// entry, or another client's data): list them all, oldest first.
	all, err := b.cli.Get(ctx, prefix(key), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return tenure.Leader{}, translate("get leader", err)
	}
	for _, kv := range all.Kvs {
		if isEntry(key, kv) {
			return leaderOf(key, []*mvccpb.KeyValue{kv}), nil
		}
	}
	return leaderOf(key, nil), nil
}

func leaderOf(key string, kvs []*mvccpb.KeyValue) tenure.Leader {
	if len(kvs) == 0 {
		return tenure.Leader{Key: key, Vacant: true}
	}
	return tenure.Leader{Key: key, Term: tenure.Term{
		Token: uint64(kvs[0].CreateRevision), Key: key, Identity: string(kvs[0].Value), Backend: Name, Entry: string(kvs[0].Key),
	}}
}

// Observe emits the oldest entry under key now and after every change under
// it.
func (b *Backend) Observe(ctx context.Context, key string, emit func(tenure.Leader)) error {
	if err := b.usable(); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := b.cli.Watch(wctx, prefix(key), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if err := awaitCreated(ctx, wch); err != nil {
		return err
	}
	for {
		l, err := b.Leader(ctx, key)
		if err != nil {
			return err
		}
		emit(l)
		if err := awaitEvents(ctx, wch); err != nil {
			return err
		}
	}
}

// awaitCreated waits for a watch's creation to be acknowledged: from then
// on, every change after the server's current revision is delivered.
func awaitCreated(ctx context.Context, wch clientv3.WatchChan) error {
	_, err := awaitCreatedRev(ctx, wch)
	return err
}

// awaitCreatedRev is awaitCreated that also returns the store's revision
// when the watch was created: changes after it are delivered.
func awaitCreatedRev(ctx context.Context, wch clientv3.WatchChan) (int64, error) {
	select {
	case wr, ok := <-wch:
		if !ok {
			return 0, watchClosed(ctx)
		}
		if err := wr.Err(); err != nil {
			return 0, translate("watch", err)
		}
		if !wr.Created {
			return 0, fmt.Errorf("%w: etcd watch: first response was not its creation", tenure.ErrUnavailable)
		}
		return wr.Header.Revision, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// awaitEvents waits for a watch response carrying events.
func awaitEvents(ctx context.Context, wch clientv3.WatchChan) error {
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				return watchClosed(ctx)
			}
			if err := wr.Err(); err != nil {
				return translate("watch", err)
			}
			if len(wr.Events) > 0 {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func watchClosed(ctx context.Context) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: etcd watch closed", tenure.ErrUnavailable)
}

// tooLarge reports a request over the client's (gRPC's send limit) or the
// server's (--max-request-bytes) size limit.
func tooLarge(err error) bool {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), "larger than max")
}

// clientClosed reports whether err is gRPC's answer to a request on a
// closed client connection (clientv3.Client.Close).
func clientClosed(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Canceled && st.Message() == "grpc: the client connection is closing"
}

// refused reports whether err is etcd refusing the request for its
// credentials: a wrong password, no user, or a role without permission.
// An expired auth token is not one: the client fetches a new one.
func refused(err error) bool {
	for _, r := range []error{rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrAuthNotEnabled, rpctypes.ErrUserNotFound} {
		if errors.Is(err, r) {
			return true
		}
	}
	// A watch cancelled by the server carries only the reason's text.
	return strings.Contains(err.Error(), rpctypes.ErrPermissionDenied.Error())
}
