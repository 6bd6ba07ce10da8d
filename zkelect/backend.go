package zkelect

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Name is the backend's name in terms, logs and metrics.
const Name = "zookeeper"

// Option configures Dial, which applies it once; without options, nodes
// get OpenACL, the connection no credentials and the log goes nowhere.
type Option func(*options)

type options struct {
	acl        []zk.ACL
	aclSet     bool // by WithACL or WithCreatorACL
	creatorACL bool // by WithCreatorACL
	auth       []authCred
	digestUser string
	log        *zap.Logger
	dialer     zk.Dialer

	handover    int32 // WithHandoverRecords
	handoverSet bool
}

// WithACL sets the ACL of every node tenure creates. Default:
// zk.WorldACL(zk.PermAll) (anyone may read, change and delete them), or
// CreatorACL(false) with WithDigestAuth.
func WithACL(acl []zk.ACL) Option { return func(o *options) { o.acl, o.aclSet = acl, true } }

// WithLogger sets the logger for go-zookeeper's messages (at Debug) and the
// backend's. Default: zap.NewNop(); a nil l keeps the default.
func WithLogger(l *zap.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithDialer sets the dialer go-zookeeper connects with. Default:
// net.DialTimeout. Either way, the Backend wraps each connection the dialer
// returns to read the zxid of its create replies (the new node's czxid);
// the wrapper passes every byte through unchanged.
func WithDialer(d zk.Dialer) Option { return func(o *options) { o.dialer = d } }

// Backend is an election.Backend on one ZooKeeper connection. It is safe for
// concurrent use. Close it when done. Create it with Dial: the zero
// Backend is not usable.
type Backend struct {
	conn    *zk.Conn
	timeout time.Duration
	acl     []zk.ACL
	log     *zap.Logger
	tap     *tap // reads the czxid off each create's reply
	// handover is WithHandoverRecords' queue length; 0: never.
	handover int32

	connP        atomic.Pointer[zk.Conn] // conn, for the event callback, which runs before Connect returns
	negotiatedMs atomic.Int32            // the session timeout the server granted
	sessionID    atomic.Int64            // the current ZooKeeper session, 0 while none
	watchEvents  atomic.Uint64
	roleReads    atomic.Uint64 // connections whose server's role was read (anchor.go)

	mu       sync.Mutex
	sessions map[*session]struct{}
	preds    map[string]<-chan zk.Event // watches on predecessors that waits gave up, by node path
	changed  chan struct{}              // closed and replaced on every session-state change
	closed   bool
	// connClosed is set, under mu, just before Close closes the
	// connection: requests then fail with ErrClosed, and start no more
	// goroutines that Close's wait would have to count.
	connClosed atomic.Bool

	wg sync.WaitGroup // calls abandoned by their ctx, session loops, call workers

	// Goroutines that ran a call and wait for the next (see call): a new
	// goroutine per call would grow its stack through go-zookeeper's
	// request path, copying it, on every request.
	tasks chan func()   // unbuffered: a send succeeds only to an idle worker
	idle  atomic.Int32  // workers waiting on tasks
	quit  chan struct{} // closed by Close, with connClosed: idle workers exit
}

// maxIdleWorkers is how many call workers may wait for work on one Backend;
// one that finishes while as many wait exits.
const maxIdleWorkers = 4

var _ election.Backend = (*Backend)(nil)

// Dial connects to the ZooKeeper servers ("host:port") with the given
// session timeout, which is the TTL every Elector on this Backend must use.
// It waits until the first session is established or ctx ends. When the
// server negotiates a different session timeout (outside its
// minSessionTimeout..maxSessionTimeout), Dial fails with
// tenure.ErrInvalidConfig rather than run with a bound nobody asked for.
// With WithDigestAuth it authenticates before it returns (go-zookeeper
// authenticates again after every reconnection, before other requests).
func Dial(ctx context.Context, servers []string, sessionTimeout time.Duration, opts ...Option) (*Backend, error) {
	o := options{acl: zk.WorldACL(zk.PermAll), log: zap.NewNop()}
	for _, opt := range opts {
		if opt != nil { // a nil Option changes nothing, as in election.New
			opt(&o)
		}
	}
	if err := o.finish(); err != nil {
		return nil, err
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: zookeeper: no servers", tenure.ErrInvalidConfig)
	}
	if err := CheckSessionTimeout(sessionTimeout); err != nil {
		return nil, err
	}
	if !o.handoverSet {
		o.handover = defaultHandoverQueue
	}
	b := &Backend{timeout: sessionTimeout, acl: o.acl, log: o.log, tap: newTap(), handover: o.handover, sessions: map[*session]struct{}{}, preds: map[string]<-chan zk.Event{}, changed: make(chan struct{}),
		tasks: make(chan func()), quit: make(chan struct{})}
	var (
		conn *zk.Conn
		err  error
	)
	conn, _, err = zk.Connect(servers, sessionTimeout, zk.WithLogger(zkLogger{b}), zk.WithEventCallback(b.onEvent), zk.WithDialer(b.tap.dialer(o.dialer)))
	if err != nil {
		return nil, fmt.Errorf("%w: zookeeper %v: %w", tenure.ErrInvalidConfig, servers, err)
	}
	b.conn = conn
	b.connP.Store(conn)
	if conn.State() == zk.StateHasSession {
		b.sessionID.Store(conn.SessionID())
	}
	b.broadcast()
	if _, err := b.awaitSession(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("%w: zookeeper %v: no session: %w", tenure.ErrUnavailable, servers, err)
	}
	if got := time.Duration(b.negotiatedMs.Load()) * time.Millisecond; got != sessionTimeout {
		b.Close()
		return nil, fmt.Errorf("%w: zookeeper negotiated a %v session timeout for the %v asked: the server's min/maxSessionTimeout exclude it", tenure.ErrInvalidConfig, got, sessionTimeout)
	}
	if err := b.authenticate(ctx, o.auth); err != nil {
		b.Close()
		return nil, err
	}
	b.readRole(ctx) // later connections read it in the background (onEvent)
	return b, nil
}

// CheckSessionTimeout refuses session timeouts below 1 s or not in whole
// milliseconds (the server may refuse more; Dial reports that). Errors wrap
// tenure.ErrInvalidConfig.
func CheckSessionTimeout(d time.Duration) error {
	if d < time.Second || d%time.Millisecond != 0 {
		return fmt.Errorf("%w: zookeeper: session timeout %v must be at least 1s, in whole milliseconds", tenure.ErrInvalidConfig, d)
	}
	return nil
}

// zkLogger forwards go-zookeeper's messages to zap and reads the negotiated
// session timeout from its "authenticated" line: go-zookeeper does not
// export it.
type zkLogger struct{ b *Backend }

func (l zkLogger) Printf(format string, args ...any) {
	if strings.HasPrefix(format, "authenticated: id=%d, timeout=%d") && len(args) == 2 {
		if ms, ok := args[1].(int32); ok {
			l.b.negotiatedMs.Store(ms)
			l.b.broadcast()
		}
	}
	l.b.log.Debug("zookeeper: " + fmt.Sprintf(format, args...))
}

// onEvent is go-zookeeper's event callback. It must not block.
func (b *Backend) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	switch ev.State {
	case zk.StateHasSession:
		c := b.connP.Load()
		if c == nil {
			return // Dial reads the session once Connect has returned
		}
		b.sessionID.Store(c.SessionID())
		b.readRoleAsync()
	case zk.StateExpired, zk.StateAuthFailed:
		b.sessionID.Store(0)
	case zk.StateDisconnected:
		// The session may still live on the server; renewals tell.
	default:
		return
	}
	b.broadcast()
	b.expireStale()
}

// isClosed reports whether Close has begun.
func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// broadcast wakes everything waiting on b.changed.
func (b *Backend) broadcast() {
	b.mu.Lock()
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// expireStale ends every session whose ZooKeeper session is gone.
func (b *Backend) expireStale() {
	cur := b.sessionID.Load()
	b.mu.Lock()
	var stale []*session
	for s := range b.sessions {
		if s.id != cur {
			stale = append(stale, s)
		}
	}
	b.mu.Unlock()
	for _, s := range stale {
		s.expired(fmt.Errorf("zookeeper session %#x replaced by %#x", s.id, cur))
	}
}

// awaitSession waits until the connection has a session and returns its id.
func (b *Backend) awaitSession(ctx context.Context) (int64, error) {
	for {
		b.mu.Lock()
		ch, closed := b.changed, b.closed
		b.mu.Unlock()
		if closed {
			return 0, tenure.ErrClosed
		}
		// go-zookeeper logs the negotiated timeout just after it reports
		// the session: wait for both.
		if id := b.sessionID.Load(); id != 0 && b.conn.State() == zk.StateHasSession && b.negotiatedMs.Load() != 0 {
			return id, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// Close closes the connection, which ends the ZooKeeper session and
// deletes every ephemeral node under it, and waits for the backend's
// goroutines. It is idempotent.
//
// Close the electors first. A session still open is ended first
// (tenure.ErrClosed), and Close waits, for up to the session's TTL, until
// its owner has closed it: an elector that leads cancels its term and
// waits for its elected work, as on Resign, before its node goes and the
// next candidate is elected. (Closing the connection at once would elect
// the next candidate within milliseconds while the elector here went on
// leading until its lease deadline.)
func (b *Backend) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	close(b.changed)
	b.changed = make(chan struct{})
	open := make([]*session, 0, len(b.sessions))
	for s := range b.sessions {
		open = append(open, s)
	}
	b.mu.Unlock()
	closedErr := fmt.Errorf("%w: zookeeper: the backend was closed with the session open", tenure.ErrClosed)
	var wait time.Duration // the longest TTL among them
	for _, s := range open {
		s.end(closedErr)
		wait = max(wait, s.opts.TTL)
	}
	waited, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for _, s := range open {
		select {
		case <-s.closed:
		case <-waited.Done():
		}
	}
	b.mu.Lock()
	b.connClosed.Store(true)
	close(b.quit)
	b.mu.Unlock()
	if b.conn != nil {
		b.conn.Close()
	}
	b.wg.Wait()
}

// Conn returns the underlying connection.
func (b *Backend) Conn() *zk.Conn { return b.conn }

// WatchEvents counts the node events delivered to tenure's watches on this
// Backend (for tests: one handoff should wake exactly one waiter).
func (b *Backend) WatchEvents() uint64 { return b.watchEvents.Load() }

// Name returns "zookeeper".
func (b *Backend) Name() string { return Name }

// Linearizable returns true: writes are ordered by the ensemble's leader,
// so each new leader's czxid is larger than every earlier leader's. Reads
// are not preceded by a sync: the connected server answers them, in the
// order of this connection's own requests.
func (b *Backend) Linearizable() bool { return true }

// CheckKey accepts absolute znode paths; see the package-level CheckKey.
func (b *Backend) CheckKey(key string) error { return CheckKey(key) }

// CheckKey accepts absolute znode paths: "/" followed by non-empty
// components other than "." and "..", no trailing slash, valid UTF-8
// without the characters the ZooKeeper server refuses in a path (controls,
// U+D800–U+F8FF, U+FFF0–U+FFFF, and characters beyond U+FFFF, which Java
// holds as surrogates), not under /zookeeper, at most 1024 bytes. Errors
// wrap tenure.ErrInvalidConfig.
func CheckKey(key string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: zookeeper: key %q %s", tenure.ErrInvalidConfig, key, why)
	}
	switch {
	case key == "":
		return fmt.Errorf("%w: zookeeper: empty key", tenure.ErrInvalidConfig)
	case !strings.HasPrefix(key, "/"):
		return bad("is not an absolute path (it must start with /)")
	case key == "/":
		return bad("is the root")
	case strings.HasSuffix(key, "/"):
		return bad("ends with /")
	case !utf8.ValidString(key):
		return bad("is not valid UTF-8")
	case strings.IndexFunc(key, forbiddenRune) >= 0:
		return bad("holds a character ZooKeeper forbids")
	case key == "/zookeeper" || strings.HasPrefix(key, "/zookeeper/"):
		return bad("is under /zookeeper, which the server reserves")
	case len(key) > 1024:
		return bad("is longer than 1024 bytes")
	}
	for _, c := range strings.Split(key[1:], "/") {
		if c == "" || c == "." || c == ".." {
			return bad("has an empty, . or .. component")
		}
	}
	return nil
}

// CheckTTL requires the TTL to be the Backend's session timeout: a
// ZooKeeper session's timeout is fixed when the connection is made.
func (b *Backend) CheckTTL(ttl time.Duration) error {
	if ttl != b.timeout {
		return fmt.Errorf("%w: zookeeper: TTL %v differs from the session timeout %v this Backend was dialed with", tenure.ErrInvalidConfig, ttl, b.timeout)
	}
	return nil
}

// translate maps a go-zookeeper error onto tenure's sentinels.
func translate(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, zk.ErrSessionExpired):
		return fmt.Errorf("%w: zookeeper %s: %w", tenure.ErrSessionExpired, op, err)
	case errors.Is(err, zk.ErrClosing):
		return fmt.Errorf("%w: zookeeper %s: %w", tenure.ErrClosed, op, err)
	case errors.Is(err, zk.ErrNoAuth):
		// Waiting will not help: the credentials or the ACL must change.
		return fmt.Errorf("%w: zookeeper %s: refused by the node's ACL (wrong or missing digest credentials?): %w", tenure.ErrInvalidConfig, op, err)
	case errors.Is(err, zk.ErrBadArguments), errors.Is(err, zk.ErrInvalidPath), errors.Is(err, zk.ErrInvalidACL),
		errors.Is(err, zk.ErrShortBuffer): // a request too large to encode: sending it again will not help
		return fmt.Errorf("%w: zookeeper %s: %w", tenure.ErrInvalidConfig, op, err)
	default:
		return fmt.Errorf("%w: zookeeper %s: %w", tenure.ErrUnavailable, op, err)
	}
}

// call runs a blocking go-zookeeper call so that ctx can end the wait.
// go-zookeeper calls take no context; an abandoned call runs on until the
// connection answers or fails it (within the session timeout), tracked by
// b.wg, and then runs undo with its result (to delete what it created).
func call[T any](ctx context.Context, b *Backend, f func() (T, error), undo func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	// The result goes to exactly one side: the caller (delivered) or, once
	// the caller has given up (abandoned), undo. One compare-and-swap each
	// decides, so a result is never both returned and undone.
	const (
		pending = iota
		delivered
		abandoned
	)
	ch := make(chan result, 1)
	var state atomic.Int32
	b.mu.Lock()
	if b.connClosed.Load() {
		b.mu.Unlock()
		var zero T
		return zero, zk.ErrClosing
	}
	b.wg.Add(1) // under mu, before Close can begin its wait
	b.mu.Unlock()
	b.run(func() {
		defer b.wg.Done()
		v, err := f()
		if errors.Is(err, zk.ErrConnectionClosed) && b.connClosed.Load() {
			err = zk.ErrClosing // closed by Close, not lost: not worth a retry
		}
		ch <- result{v, err}
		if !state.CompareAndSwap(pending, delivered) && undo != nil {
			undo(v, err)
		}
	})
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		if !state.CompareAndSwap(pending, abandoned) {
			// Delivered as ctx ended: the result is the caller's (it is
			// in ch, sent before the swap).
			r := <-ch
			return r.v, r.err
		}
		var zero T
		return zero, ctx.Err()
	}
}

// run runs task on an idle call worker, or on a new one. The caller holds
// a count of b.wg (call's), so the worker's Add cannot race Close's Wait.
func (b *Backend) run(task func()) {
	select {
	case b.tasks <- task:
		return
	default:
	}
	b.wg.Add(1)
	go b.worker(task)
}

// worker runs task, then the tasks run hands it, until Close, or until it
// finishes one while maxIdleWorkers others wait.
func (b *Backend) worker(task func()) {
	defer b.wg.Done()
	for {
		task()
		if b.idle.Add(1) > maxIdleWorkers {
			b.idle.Add(-1)
			return
		}
		select {
		case task = <-b.tasks:
			b.idle.Add(-1)
		case <-b.quit:
			b.idle.Add(-1)
			return
		}
	}
}

// Leader reads the lowest contender under key.
func (b *Backend) Leader(ctx context.Context, key string) (tenure.Leader, error) {
	l, _, err := b.leader(ctx, key, false)
	return l, err
}

// leader reads the lowest contender; with watch, it also returns a channel
// that fires on the next change of key's children, or, while key's node
// does not exist, when it is created. The head's data is not watched: a
// candidate's identity is written once, with its node.
func (b *Backend) leader(ctx context.Context, key string, watch bool) (tenure.Leader, <-chan zk.Event, error) {
	type out struct {
		children []string
		ch       <-chan zk.Event
	}
	for {
		res, err := call(ctx, b, func() (out, error) {
			if watch {
				c, _, ch, err := b.conn.ChildrenW(key)
				return out{c, ch}, err
			}
			c, _, err := b.conn.Children(key)
			return out{c, nil}, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			if !watch {
				return tenure.Leader{Key: key, Vacant: true}, nil, nil
			}
			// Watch for the key's node to appear.
			ex, err := call(ctx, b, func() (<-chan zk.Event, error) {
				ok, _, ch, err := b.conn.ExistsW(key)
				if err == nil && ok {
					return nil, errRetry
				}
				return ch, err
			}, nil)
			if errors.Is(err, errRetry) {
				continue
			}
			if err != nil {
				return tenure.Leader{}, nil, translate("watch "+key, err)
			}
			return tenure.Leader{Key: key, Vacant: true}, ex, nil
		}
		if err != nil {
			return tenure.Leader{}, nil, translate("children of "+key, err)
		}
		cs := contenders(res.children)
		if len(cs) == 0 {
			return tenure.Leader{Key: key, Vacant: true}, res.ch, nil
		}
		head := path.Join(key, cs[0].name)
		type node struct {
			data []byte
			stat *zk.Stat
		}
		n, err := call(ctx, b, func() (node, error) {
			d, st, err := b.conn.Get(head)
			return node{d, st}, err
		}, nil)
		if errors.Is(err, zk.ErrNoNode) {
			continue // the head left between the two reads
		}
		if err != nil {
			return tenure.Leader{}, nil, translate("get "+head, err)
		}
		return tenure.Leader{Key: key, Term: tenure.Term{
			Token: uint64(n.stat.Czxid), Key: key, Identity: string(n.data), Backend: Name, Entry: head,
		}}, res.ch, nil
	}
}

var errRetry = errors.New("retry")

// Observe emits the lowest contender under key now and after every change
// of key's children.
func (b *Backend) Observe(ctx context.Context, key string, emit func(tenure.Leader)) error {
	for {
		l, ch, err := b.leader(ctx, key, true)
		if err != nil {
			return err
		}
		emit(l)
		select {
		case ev := <-ch:
			b.watchEvents.Add(1)
			if ev.Err != nil && !errors.Is(ev.Err, zk.ErrSessionExpired) {
				return translate("watch "+key, ev.Err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// forbiddenRune reports the characters ZooKeeper's PathUtils.validatePath
// refuses, which it checks on Java's UTF-16 code units: a character beyond
// U+FFFF is a surrogate pair there, in the refused U+D800–U+F8FF.
func forbiddenRune(r rune) bool {
	return r < 0x20 || (r >= 0x7f && r <= 0x9f) || (r >= 0xd800 && r <= 0xf8ff) || r >= 0xfff0
}
