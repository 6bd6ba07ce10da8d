package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// Name is the backend's name in terms, logs and metrics.
const Name = "redis"

// Options tune the backend. The zero value is ready to use; each field
// states its default. A plain value: Dial keeps its own copy.
type Options struct {
	// DriftFactor is the clock drift allowed between this process and the
	// Redis servers, as a fraction of the TTL; 2 ms are added to it, as
	// Redlock does. It is subtracted from every validity time. Default:
	// 0.01.
	DriftFactor float64
	// PollInterval is how often Observe re-reads the leader without a
	// message (keys that expire publish nothing), and how long a waiter
	// waits before trying again when the key is held without an expiry
	// (not tenure's). (A waiter behind a tenure holder tries again when the
	// holder's key would expire, unless a release wakes it first; after
	// masters that did not answer, 50 ms later.) Default: 500 ms.
	PollInterval time.Duration
	// ChannelPrefix prefixes the pub/sub channel of a key. Default:
	// "tenure:".
	ChannelPrefix string
	// MasterTimeout bounds the wait for each master's answer when there
	// are several (Redlock's per-instance timeout, small against the
	// TTL): a master that is cut off, whose connection accepts and never
	// answers, must not hold up an acquisition that the other masters can
	// grant. A master that has not answered in time counts as failed, and
	// its call as possibly done (a try is then undone on every master, as
	// after a lost reply). A try or renewal returns as soon as a quorum
	// has granted it. Default: a tenth of the session's TTL, and 1 s for
	// Leader and Observe. With one master, only the TTL (and the client's
	// own timeouts) bound a call.
	MasterTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.DriftFactor == 0 {
		o.DriftFactor = 0.01
	}
	if o.PollInterval == 0 {
		o.PollInterval = 500 * time.Millisecond
	}
	if o.ChannelPrefix == "" {
		o.ChannelPrefix = "tenure:"
	}
	return o
}

func (o Options) validate() error {
	if !(o.DriftFactor >= 0 && o.DriftFactor < 0.5) { // NaN too
		return fmt.Errorf("%w: redislock: DriftFactor %v must be in [0, 0.5)", tenure.ErrInvalidConfig, o.DriftFactor)
	}
	if o.MasterTimeout < 0 {
		return fmt.Errorf("%w: redislock: MasterTimeout %v must not be negative", tenure.ErrInvalidConfig, o.MasterTimeout)
	}
	if o.PollInterval < time.Millisecond {
		return fmt.Errorf("%w: redislock: PollInterval %v must be at least 1ms", tenure.ErrInvalidConfig, o.PollInterval)
	}
	return nil
}

// Backend is an election.Backend on one Redis master, or on N independent
// masters (Redlock). It is safe for concurrent use.
type Backend struct {
	masters []*redis.Client
	names   []string // the masters' addresses, for errors
	opts    Options
	owned   bool // Close closes the clients (Dial made them)
	closed  atomic.Bool
}

// New returns a backend on the given masters: one for a plain Redis lock,
// several independent ones (not replicas of each other) for Redlock. The
// caller keeps ownership of the clients; Backend.Close does not close them.
//
// With several masters, build the clients with DialerRetries: 1. go-redis
// (9.x) otherwise makes five attempts, 100 ms apart, at every dial, and
// until it has failed PoolSize dials to a master that is down, each try
// that needs that master's answer (every try that finds the key held or
// split, not one that wins a quorum) waits 400 ms for it. Dial does this
// by default. Build them with ContextTimeoutEnabled: true as well: each
// call to a master is bounded by Options.MasterTimeout through its ctx,
// and go-redis otherwise sets its socket deadlines from ReadTimeout alone
// (5 s by default), so that a call to a master that does not answer holds
// a goroutine and a connection that long after the backend stopped
// waiting for it. Dial always sets it.
func New(masters []*redis.Client, opts Options) (*Backend, error) {
	if len(masters) == 0 {
		return nil, fmt.Errorf("%w: redislock: no Redis masters", tenure.ErrInvalidConfig)
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	b := &Backend{masters: slices.Clone(masters), opts: opts} // a caller's later change of its slice is not ours
	for i, m := range masters {
		if m == nil {
			return nil, fmt.Errorf("%w: redislock: master %d is nil", tenure.ErrInvalidConfig, i)
		}
		addr := m.Options().Addr
		for j, n := range b.names {
			if masters[j] == m || n == addr {
				return nil, fmt.Errorf("%w: redislock: masters %d and %d are both %s (Redlock needs independent masters)", tenure.ErrInvalidConfig, j, i, addr)
			}
		}
		b.names = append(b.names, addr)
	}
	return b, nil
}

// Dial connects to the masters at addrs (host:port), one client each, with
// base's settings (username, password, TLS, timeouts; Addr is replaced;
// nil means defaults; maintenance notifications are off unless base turns
// them on; one dial attempt, not go-redis's five, unless base sets
// DialerRetries; ContextTimeoutEnabled: see New), and checks that a quorum
// answers PING. Close the backend to close the clients.
func Dial(ctx context.Context, addrs []string, base *redis.Options, opts Options) (*Backend, error) {
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: redislock: no Redis endpoints", tenure.ErrInvalidConfig)
	}
	seen := map[string]string{} // address (as given, and resolved) → endpoint
	for _, a := range addrs {
		host, port, err := splitHostPort(a)
		if err != nil {
			return nil, err
		}
		if seen[a] != "" {
			return nil, fmt.Errorf("%w: redislock: endpoint %s given twice (Redlock needs independent masters)", tenure.ErrInvalidConfig, a)
		}
		seen[a] = a
		if len(addrs) == 1 {
			continue
		}
		// Two names of one server (localhost and 127.0.0.1) would give it
		// two votes. A name that does not resolve now is left to the dial.
		ips, _ := net.DefaultResolver.LookupHost(ctx, host)
		for _, ip := range ips {
			k := net.JoinHostPort(ip, strconv.Itoa(port))
			if other := seen[k]; other != "" && other != a {
				return nil, fmt.Errorf("%w: redislock: endpoints %s and %s are the same server (%s; Redlock needs independent masters)", tenure.ErrInvalidConfig, other, a, k)
			}
			seen[k] = a
		}
	}
	var clients []*redis.Client
	for _, a := range addrs {
		o := &redis.Options{}
		if base != nil {
			c := *base
			o = &c
		}
		o.Addr = a
		if o.MaintNotificationsConfig == nil {
			// Maintenance notifications are a managed-cloud feature; off,
			// they cost no handshake per connection and no goroutines.
			o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		}
		if o.DialerRetries == 0 {
			// A master that is down answers each dial at once, with a
			// refusal: four more attempts 100 ms apart only hold up the
			// tries that wait for it (see New).
			o.DialerRetries = 1
		}
		// Socket deadlines from each call's ctx (fanOut's per-master
		// bound), not the read timeout alone (see New).
		o.ContextTimeoutEnabled = true
		clients = append(clients, redis.NewClient(o))
	}
	b, err := New(clients, opts)
	if err != nil {
		closeAll(clients)
		return nil, err
	}
	b.owned = true
	if _, err := b.pingQuorum(ctx, b.leaderTimeout()); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func splitHostPort(a string) (string, int, error) {
	i := strings.LastIndexByte(a, ':')
	if i <= 0 || i == len(a)-1 {
		return "", 0, fmt.Errorf("%w: redislock: endpoint %q is not HOST:PORT", tenure.ErrInvalidConfig, a)
	}
	p, err := strconv.Atoi(a[i+1:])
	if err != nil || p <= 0 || p > 65535 {
		return "", 0, fmt.Errorf("%w: redislock: endpoint %q has no valid port", tenure.ErrInvalidConfig, a)
	}
	return a[:i], p, nil
}

func closeAll(cs []*redis.Client) {
	for _, c := range cs {
		_ = c.Close()
	}
}

// Close closes the clients Dial made (a backend from New leaves them
// open). Sessions must be closed first; afterwards OpenSession, Leader
// and Observe return tenure.ErrClosed. Close is idempotent.
func (b *Backend) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	if b.owned {
		closeAll(b.masters)
	}
	return nil
}

// usable returns why b cannot be used: closed, or a zero Backend (not
// made by New or Dial).
func (b *Backend) usable() error {
	switch {
	case len(b.masters) == 0:
		return fmt.Errorf("%w: redislock: a Backend without masters (make it with New or Dial)", tenure.ErrInvalidConfig)
	case b.closed.Load():
		return fmt.Errorf("%w: redislock: the backend is closed", tenure.ErrClosed)
	}
	return nil
}

// Masters returns the masters' addresses.
func (b *Backend) Masters() []string { return append([]string(nil), b.names...) }

// Name implements election.Backend: "redis".
func (b *Backend) Name() string { return Name }

// Linearizable implements election.Backend: false. Redis replication is
// asynchronous and keys expire by the server's clock, so tokens can go back
// and two holders can overlap (see the package documentation).
func (b *Backend) Linearizable() bool { return false }

// quorum is N/2+1.
func (b *Backend) quorum() int { return len(b.masters)/2 + 1 }

// MaxKeyLen is the longest key the backend takes, in bytes.
const MaxKeyLen = 512

// CheckKey implements election.Backend: a key is valid UTF-8 of 1 to
// MaxKeyLen bytes, without spaces or control characters, and is none of
// the backend's own keys for another lock: it does not end in ":fence" (the
// token counters) or ":waiting" (the waiting sets), and does not contain
// ":gone:" (the tombstones of given-up campaigns).
func (b *Backend) CheckKey(key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return b.usable()
}

// CheckKey is Backend.CheckKey, usable before a backend exists.
func CheckKey(key string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: redislock: key %q %s", tenure.ErrInvalidConfig, key, why)
	}
	switch {
	case key == "":
		return fmt.Errorf("%w: redislock: empty key", tenure.ErrInvalidConfig)
	case len(key) > MaxKeyLen:
		return bad(fmt.Sprintf("is longer than %d bytes", MaxKeyLen))
	case !utf8.ValidString(key):
		return bad("is not valid UTF-8")
	case strings.HasSuffix(key, fenceSuffix):
		return bad("ends in " + fenceSuffix + ", the suffix of tenure's token counters")
	case strings.HasSuffix(key, waitingSuffix):
		return bad("ends in " + waitingSuffix + ", the suffix of tenure's waiting sets")
	case strings.Contains(key, goneInfix):
		return bad("contains " + goneInfix + ", the infix of tenure's tombstones")
	}
	for _, r := range key {
		if unicode.IsSpace(r) || unicode.IsControl(r) {
			return bad("contains a space or control character")
		}
	}
	return nil
}

// MinTTL and MaxTTL bound the TTLs the backend takes.
const (
	MinTTL = 100 * time.Millisecond
	MaxTTL = 24 * time.Hour
)

// CheckTTL implements election.Backend: PX takes whole milliseconds, from
// MinTTL to MaxTTL.
func (b *Backend) CheckTTL(ttl time.Duration) error {
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Millisecond != 0 {
		return fmt.Errorf("%w: redislock: TTL %v must be whole milliseconds from %v to %v", tenure.ErrInvalidConfig, ttl, MinTTL, MaxTTL)
	}
	return nil
}

// drift is the clock drift allowance for ttl.
func (b *Backend) drift(ttl time.Duration) time.Duration {
	return time.Duration(float64(ttl)*b.opts.DriftFactor) + 2*time.Millisecond
}

const fenceSuffix = ":fence"

func (b *Backend) channel(key string) string { return b.opts.ChannelPrefix + key }

const waitingSuffix = ":waiting"

// goneInfix names a campaign's tombstone: "<key>:gone:<random>".
const goneInfix = ":gone:"

// maxWakeTries bounds the waiters one release tries to wake: each is taken
// out of the set, and when no subscriber heard it, the next is tried.
const maxWakeTries = 16

// luaNow starts the scripts that need the server's time: now, in ms.
const luaNow = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
`

// The scripts. A lock's value is "<random> <token> <identity>"; the random
// part (ARGV[1]) identifies one acquisition. "<key>:waiting" is a sorted
// set of the candidates waiting for the key (by their random part), scored
// by the server time, in ms, until which each is known to live; a release
// wakes one of them, so that a handoff costs a few commands however many
// wait (waking all of them made every waiter run the acquire script).
var (
	// KEYS: lock, counter, waiting, tombstone. ARGV: random, identity, ttl
	// ms, channel, waiting member ("<session> <random>"). Returns {1,
	// token} when the lock is (now or already) the caller's, {0, pttl} when
	// someone else holds it; then the caller is registered as waiting.
	// Returns {-1, 0}, and does nothing, when the random part's campaign
	// has ended (its tombstone stands): a try that reaches the server after
	// its own clean-up.
	acquireScript = redis.NewScript(luaNow + `
-- GET, not EXISTS: the ACL in docs/security.md grants GET.
if redis.call('GET', KEYS[4]) then
  return {-1, 0}
end
local v = redis.call('GET', KEYS[1])
local p = ARGV[1] .. ' '
if v then
  if string.sub(v, 1, #p) == p then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    local rest = string.sub(v, #p + 1)
    local sp = string.find(rest, ' ', 1, true)
    return {1, string.sub(rest, 1, sp - 1)}
  end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[5])
  -- Extend, never shorten: the set holds waiters of longer TTLs too.
  if redis.call('PTTL', KEYS[3]) < 2 * tonumber(ARGV[3]) then
    redis.call('PEXPIRE', KEYS[3], 2 * tonumber(ARGV[3]))
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('ZREM', KEYS[3], ARGV[5])
redis.call('INCR', KEYS[2])
local tok = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], p .. tok .. ' ' .. ARGV[2], 'NX', 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], 'acquired')
return {1, tok}
`)
	// KEYS: lock, waiting, tombstone. ARGV: random, channel, waiting
	// member, tombstone ms ("0": none), keep ("1": keep the caller's
	// waiting entry). Deletes the lock only if it is the caller's, and,
	// unless kept, the caller's waiting entry; with a tombstone, it marks
	// the random part's campaign ended, so that a try still on its way
	// does nothing (acquireScript).
	//
	// After a delete it drops the waiters not heard from within their TTL
	// and wakes the one heard from least recently: it takes that waiter
	// out of the set and publishes its random part on the waiter's session
	// channel ("<channel>:<session>"), so that only it wakes. The woken
	// waiter tries at once, and registers again if it loses; one that
	// cannot act on it (stalled) absorbs this wake-up only. A waiter whose
	// channel has no subscriber cannot hear it (its process died and its
	// connection closed, or it is between its first try and its
	// subscription, after which it tries again): the next one is woken,
	// up to maxWakeTries. Last, it publishes "released" on the key's
	// channel, for observers.
	releaseScript = redis.NewScript(luaNow + `
if ARGV[5] ~= '1' then
  redis.call('ZREM', KEYS[2], ARGV[3])
end
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[4])
end
local v = redis.call('GET', KEYS[1])
local p = ARGV[1] .. ' '
if v and string.sub(v, 1, #p) == p then
  redis.call('DEL', KEYS[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  for i = 1, ` + strconv.Itoa(maxWakeTries) + ` do
    local next = redis.call('ZRANGE', KEYS[2], 0, 0)
    if not next[1] then
      break
    end
    redis.call('ZREM', KEYS[2], next[1])
    local sp = string.find(next[1], ' ', 1, true)
    if sp and redis.call('PUBLISH', ARGV[2] .. ':' .. string.sub(next[1], 1, sp - 1), string.sub(next[1], sp + 1)) > 0 then
      break
    end
  end
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
`)
	// KEYS: lock. ARGV: random, ttl ms, the holder's value. Extends only
	// the caller's lock; a value of the caller's with another token (a
	// master that granted a try late, under its own count) takes the
	// holder's value, the token its term has.
	extendScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
local p = ARGV[1] .. ' '
if v and string.sub(v, 1, #p) == p then
  if v ~= ARGV[3] then
    redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
    return 1
  end
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)
	// KEYS: lock. ARGV: value, new value. Replaces the lock's value, as
	// long as it is exactly value, keeping its expiry (a late master's
	// grant takes the holder's token: session.lateGrant).
	retokenScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
    return 1
  end
end
return 0
`)
	// KEYS: token counter. ARGV: token. Raises the counter to the token
	// when it is below (session.countersReach).
	raiseScript = redis.NewScript(`
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
`)
	// KEYS: waiting. ARGV: waiting member, ttl ms. Renews a waiting entry
	// (the watchdog, for candidates that wait).
	stillWaitingScript = redis.NewScript(luaNow + `
local n = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1])
-- CH counts no change when the score is the same: renewed within the
-- millisecond of the last renewal or registration. Still registered if an
-- increment by 0 finds it (ZADD only: the ACL in docs/security.md).
if n == 0 and redis.call('ZADD', KEYS[1], 'XX', 'INCR', 0, ARGV[1]) then
  n = 1
end
-- Extend, never shorten: the set holds waiters of longer TTLs too.
if n > 0 and redis.call('PTTL', KEYS[1]) < 2 * tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
end
return n
`)
)

// parseValue splits a lock value into its random part, token and identity.
// ok is false for a value tenure did not write.
func parseValue(v string) (random string, token uint64, identity string, ok bool) {
	random, rest, ok1 := strings.Cut(v, " ")
	tok, identity, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || len(random) != 32 {
		return "", 0, "", false
	}
	if _, err := hex.DecodeString(random); err != nil {
		return "", 0, "", false
	}
	n, err := strconv.ParseUint(tok, 10, 64)
	if err != nil || n == 0 {
		return "", 0, "", false
	}
	return random, n, identity, true
}

func newRandom() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b[:])
}

// reply is one master's answer in a fan-out.
type reply struct {
	i   int
	val any
	err error
}

// errNoAnswer marks a master that had not answered when a fan-out stopped
// waiting (its bound passed, ctx ended, or a quorum had already answered):
// its call may still run, and may still take effect.
var errNoAnswer = errors.New("no answer in time")

// fanOut runs f on every master concurrently and returns the replies in
// master order: once every master has answered, or a quorum of replies
// satisfy enough (when not nil), or ctx ends, or per (when positive) has
// passed. A master without an answer by then has errNoAnswer, joined with
// ctx's error when ctx ended. go-redis does not stop a call blocked on a
// socket when ctx is cancelled, only at its deadline, so a cut-off master
// (a connection that accepts and never answers) would otherwise hold up
// the others, and the caller, until the client's read timeout. With per,
// each call's ctx ends after per, and not before, even when ctx does: a
// late release still deletes its key, and, on a client with
// ContextTimeoutEnabled (Dial's), go-redis sets its socket deadlines from
// it (without, from ReadTimeout alone). late, when not nil, gets the
// replies of the calls given up on (to close what they hold).
func (b *Backend) fanOut(ctx context.Context, per time.Duration, enough func(reply) bool, late func(reply), f func(ctx context.Context, c *redis.Client) (any, error)) []reply {
	out := make([]reply, len(b.masters))
	answered := make([]bool, len(b.masters))
	ch := make(chan reply, len(b.masters))
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if per > 0 {
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), per)
	}
	for i, c := range b.masters {
		go func() {
			v, err := f(cctx, c)
			ch <- reply{i, v, err}
		}()
	}
	// The calls' ctx ends once all have answered, or with per: the
	// goroutines of calls given up on go on until then.
	defer func() {
		left := len(b.masters) - count(answered)
		if left == 0 {
			cancel()
			return
		}
		go func() {
			for range left {
				if r := <-ch; late != nil {
					late(r)
				}
			}
			cancel()
		}()
	}()
	var timeout <-chan struct{} // the calls' own deadline, per after the start
	if per > 0 {
		timeout = cctx.Done()
	}
	good := 0
	for n := 0; n < len(b.masters); n++ {
		select {
		case r := <-ch:
			out[r.i], answered[r.i] = r, true
			if enough != nil && enough(r) {
				if good++; good >= b.quorum() {
					return b.unanswered(out, answered, nil)
				}
			}
		case <-ctx.Done():
			return b.unanswered(out, answered, ctx.Err())
		case <-timeout:
			return b.unanswered(out, answered, nil)
		}
	}
	return out
}

// unanswered sets errNoAnswer (joined with cause) in the replies of the
// masters that have not answered.
func (b *Backend) unanswered(out []reply, answered []bool, cause error) []reply {
	for i, ok := range answered {
		if !ok {
			out[i] = reply{i, nil, errors.Join(errNoAnswer, cause)}
		}
	}
	return out
}

func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// leaderTimeout is fanOut's bound for the reads outside a session
// (Leader): Options.MasterTimeout, or 1 s, with several masters; none but
// ctx and the client's timeouts with one.
func (b *Backend) leaderTimeout() time.Duration {
	switch {
	case len(b.masters) == 1:
		return 0
	case b.opts.MasterTimeout > 0:
		return b.opts.MasterTimeout
	}
	return time.Second
}

// masterTimeout is fanOut's bound for a session's calls: with several
// masters, Options.MasterTimeout or ttl/10; with one, the TTL (no other
// master can answer instead, and an answer later than the TTL is of no use).
func (b *Backend) masterTimeout(ttl time.Duration) time.Duration {
	if len(b.masters) == 1 {
		return ttl
	}
	if b.opts.MasterTimeout > 0 {
		return b.opts.MasterTimeout
	}
	return ttl / 10
}

// quorumErr explains a fan-out that did not reach a quorum, naming the
// masters that failed.
func (b *Backend) quorumErr(what string, rs []reply, ok int) error {
	var failed []string
	var errs []error
	closed := 0
	for _, r := range rs {
		if r.err != nil {
			failed = append(failed, b.names[r.i])
			errs = append(errs, fmt.Errorf("%s: %w", b.names[r.i], r.err))
			if errors.Is(r.err, redis.ErrClosed) {
				closed++
			}
		}
	}
	kind := tenure.ErrUnavailable
	switch {
	case len(b.masters)-closed < b.quorum():
		// The caller closed clients (or Close did): too few are left
		// for a quorum, and none will open again.
		kind = tenure.ErrClosed
	case refused(errs):
		kind = tenure.ErrInvalidConfig // waiting will not help
	}
	if len(b.masters) == 1 {
		return fmt.Errorf("%w: redislock: %s on %s: %w", kind, what, b.names[0], rs[0].err)
	}
	return fmt.Errorf("%w: redislock: %s: %d of %d masters answered, quorum is %d; failed: %s: %w",
		kind, what, ok, len(b.masters), b.quorum(), strings.Join(failed, ", "), errors.Join(errs...))
}

// refused reports whether a server refused the client's credentials or
// permissions (NOAUTH, WRONGPASS, NOPERM, or an ACL refusal inside a
// script), which no retry can fix.
func refused(errs []error) bool {
	for _, err := range errs {
		var re redis.Error
		if errors.As(err, &re) {
			msg := re.Error()
			if strings.HasPrefix(msg, "NOAUTH") || strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOPERM") ||
				// The same refusals, raised inside a script.
				strings.Contains(msg, "can't run this command") || strings.Contains(msg, "can't access") ||
				strings.Contains(msg, "No permissions") {
				return true
			}
		}
	}
	return false
}

// pingQuorum pings every master, each bounded by per (see fanOut), and
// returns how many answered, or an error when fewer than a quorum did. It
// returns as soon as a quorum has answered.
func (b *Backend) pingQuorum(ctx context.Context, per time.Duration) (int, error) {
	rs := b.fanOut(ctx, per, func(r reply) bool { return r.err == nil }, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		return c.Ping(ctx).Result()
	})
	ok := 0
	for _, r := range rs {
		if r.err == nil {
			ok++
		}
	}
	if ok < b.quorum() {
		// Also when ctx ended first: the error names the masters that
		// did not answer (a cut-off one accepts and never answers), and
		// wraps ctx's error with theirs.
		return ok, b.quorumErr("PING", rs, ok)
	}
	return ok, nil
}

// OpenSession implements election.Backend. Redis has no sessions: this one
// lives in this process, pings a quorum of masters to start, and extends
// every key it holds every opts.RenewInterval (the watchdog).
func (b *Backend) OpenSession(ctx context.Context, opts election.SessionOptions) (election.Session, error) {
	if err := b.usable(); err != nil {
		return nil, err
	}
	if err := b.CheckTTL(opts.TTL); err != nil {
		return nil, err
	}
	if opts.RenewInterval <= 0 || opts.RenewInterval >= opts.TTL {
		return nil, fmt.Errorf("%w: redislock: renew interval %v must be in (0, TTL %v)", tenure.ErrInvalidConfig, opts.RenewInterval, opts.TTL)
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	sent := now()
	if _, err := b.pingQuorum(ctx, b.masterTimeout(opts.TTL)); err != nil {
		return nil, err
	}
	s := &session{
		b: b, ttl: opts.TTL, every: opts.RenewInterval, now: now, id: newRandom()[:16],
		granted: election.Renewal{Sent: sent, TTL: opts.TTL - b.drift(opts.TTL)},
		entries: map[string]*entry{},
		subs:    map[string]*subscription{},
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	s.Init()
	go s.watchdog()
	return s, nil
}

// Leader implements election.Backend: the holder whose value a quorum of
// masters has. A value tenure did not write makes the key held by an
// unknown holder (Identity empty, Token 0).
func (b *Backend) Leader(ctx context.Context, key string) (tenure.Leader, error) {
	if err := b.CheckKey(key); err != nil {
		return tenure.Leader{}, err
	}
	rs := b.fanOut(ctx, b.leaderTimeout(), nil, nil, func(ctx context.Context, c *redis.Client) (any, error) {
		v, err := c.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		return v, err
	})
	answered := 0
	votes := map[string]int{} // by random part; foreign values by themselves
	for _, r := range rs {
		if r.err != nil {
			continue
		}
		answered++
		if v := r.val.(string); v != "" {
			votes[holderOf(v)]++
		}
	}
	if answered < b.quorum() {
		if ctx.Err() != nil {
			return tenure.Leader{}, ctx.Err()
		}
		return tenure.Leader{}, b.quorumErr("GET "+key, rs, answered)
	}
	for holder, n := range votes {
		if n < b.quorum() {
			continue
		}
		term := tenure.Term{Key: key, Backend: Name, Advisory: true}
		for _, r := range rs {
			v, _ := r.val.(string)
			if r.err != nil || v == "" || holderOf(v) != holder {
				continue
			}
			// Each master counts its own tokens: the largest is the term's.
			if random, tok, id, ok := parseValue(v); ok && tok > term.Token {
				term.Token, term.Identity, term.Entry = tok, id, random
			}
		}
		return tenure.Leader{Key: key, Term: term}, nil
	}
	return tenure.Leader{Key: key, Vacant: true}, nil
}

// holderOf names the holder of a lock value: its random part, or the whole
// value when tenure did not write it.
func holderOf(v string) string {
	if random, _, _, ok := parseValue(v); ok {
		return random
	}
	return "foreign " + v
}

// Observe implements election.Backend: it emits the leader now, after every
// acquisition or release message on the key's channel, and at least every
// PollInterval (keys that expire publish nothing).
func (b *Backend) Observe(ctx context.Context, key string, emit func(tenure.Leader)) error {
	if err := b.CheckKey(key); err != nil {
		return err
	}
	sub, err := b.subscribe(ctx, b.leaderTimeout(), b.channel(key))
	if err != nil {
		return err
	}
	defer sub.close()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.ch:
		case <-t.C:
		}
		l, err := b.Leader(ctx, key)
		if err != nil {
			return err
		}
		emit(l)
		t.Reset(b.opts.PollInterval)
	}
}

// subscription listens on a channel on every master that answers: a key's
// channel (observers), or a session's channel for a key (waiters). Its wake
// channel holds one pending wake-up at most. A waiter sets want to its
// random part: then only a message naming it wakes it (one left from an
// earlier campaign of the session does not); without want, every message
// does.
type subscription struct {
	pss  []*redis.PubSub
	ch   chan struct{}
	want atomic.Pointer[string]
	wg   sync.WaitGroup
}

func (s *subscription) wakes(payload string) bool {
	w := s.want.Load()
	if w == nil {
		return true
	}
	return payload == *w
}

// subscribe subscribes to ch on every master, each bounded by per (when
// positive; see fanOut), and returns once every master has answered or
// been given up: a quorum must have subscribed. A subscription that comes
// after it was given up is closed.
func (b *Backend) subscribe(ctx context.Context, per time.Duration, ch string) (*subscription, error) {
	s := &subscription{ch: make(chan struct{}, 1)}
	closeLate := func(r reply) {
		if ps, ok := r.val.(*redis.PubSub); ok && r.err == nil {
			_ = ps.Close()
		}
	}
	rs := b.fanOut(ctx, per, nil, closeLate, func(ctx context.Context, c *redis.Client) (any, error) {
		ps := c.Subscribe(ctx, ch)
		// The reply says the subscription is active. go-redis's Receive
		// watches neither ctx nor, by default, the clock: a master that
		// stalls mid-subscribe would hold the campaign, and every other
		// master's reply with it, for good. The client's read timeout
		// bounds the wait, and ctx ending closes the subscription, which
		// ends the read.
		stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
		_, err := ps.ReceiveTimeout(ctx, max(c.Options().ReadTimeout, 0))
		if !stop() && err == nil {
			err = ctx.Err()
		}
		if err != nil {
			_ = ps.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		}
		return ps, nil
	})
	ok := 0
	for _, r := range rs {
		if r.err != nil {
			continue
		}
		ok++
		ps := r.val.(*redis.PubSub)
		s.pss = append(s.pss, ps)
		msgs := ps.Channel()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for m := range msgs {
				if !s.wakes(m.Payload) {
					continue
				}
				select {
				case s.ch <- struct{}{}:
				default:
				}
			}
		}()
	}
	if ok < b.quorum() {
		s.close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, b.quorumErr("SUBSCRIBE "+ch, rs, ok)
	}
	return s, nil
}

func (s *subscription) close() {
	for _, ps := range s.pss {
		_ = ps.Close()
	}
	s.wg.Wait()
}
