package chaos

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/zkelect"
)

// The candidate process: the test binary re-executed with
// TENURE_CHAOS_CANDIDATE=1 (see TestMain). It campaigns with election.Run on
// one key and, while it leads, writes term-stamped values to the checker's
// fenced register and reads them back. Every step goes to stdout as one
// line stamped with CLOCK_MONOTONIC, which every process on the machine
// shares, so the checker can order events across processes:
//
//	ELECTED <token> <t> <entry> [<zk session id> <zk password hex>]
//	CTXEND <token> <t> <cause>            the term's context ended
//	WORKEND <token> <t>                   OnElected returned
//	HARDSTOP <token> <t>                  OnElected outlived StopTimeout
//	W <op> <token> <value> <t>            a write is sent
//	WR <op> <t> ok|stale|err              its answer
//	R <op> <t>                            a read is sent
//	RR <op> <t> <token> <value> | RR <op> <t> err
//	FREEZE <t>                            it stops itself (SIGUSR1 asked)
//	LEFT <n> <t>                          ZooKeeper: nodes under the key still
//	                                      owned by its live session after Close
//	LEFTERR <t> <error>                   ZooKeeper: they could not be counted
//	EXIT <t> <Run's error>
//
// Closing its stdin ends it gracefully: Run resigns and returns. SIGUSR1
// makes a leader stop itself (SIGSTOP) between its next context check and
// its next write; SIGCONT resumes it.

// Environment of a candidate process.
const (
	envCandidate = "TENURE_CHAOS_CANDIDATE"
	envBackend   = "CHAOS_BACKEND"   // a backends[].name
	envEndpoints = "CHAOS_ENDPOINTS" // comma-separated, the candidate's proxies
	envKey       = "CHAOS_KEY"
	envID        = "CHAOS_ID"
	envTTL       = "CHAOS_TTL"      // milliseconds
	envRegister  = "CHAOS_REGISTER" // the checker's register URL
	envEvery     = "CHAOS_EVERY"    // milliseconds between writes
	envBroken    = "CHAOS_BROKEN"   // "", brokenNoDeadline or brokenStall
	// envHandover "1": an etcd or ZooKeeper candidate records and reads
	// handovers on every queue (WithHandoverRecords(1)), not only on
	// queues of 32 keys or more, which the chaos lanes never reach.
	envHandover = "CHAOS_HANDOVER"
)

// brokenNoDeadline is the lease-deadline-off variant: the elected work
// ignores its cancelled context for another 2·TTL and OnHardStop does not
// stop it, so the deadline is never enforced and the work runs on after
// the server has expired the lease and elected a successor. The checker
// must see overlapping leaders.
const brokenNoDeadline = "nodeadline"

// brokenStall is the leaderless-lane variant: each process, in its first
// term, reports the term ended at once and then keeps its entry at the
// head of the queue for stallFor, leading nobody: the lane has no leader
// although no fault explains it. The checker must see the gap.
const brokenStall = "stall"

// stallFor is how long brokenStall's entry blocks the lane: above the
// crash bound plus slack (about 4 s).
const stallFor = 6 * time.Second

// mono reads CLOCK_MONOTONIC in nanoseconds: one clock for every process on
// this machine, unlike the monotonic reading in time.Time, which is
// per-process.
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

// word turns an error into one field of an output line.
func word(err error) string {
	return strings.Join(strings.Fields(fmt.Sprint(err)), "_")
}

type out struct{ mu sync.Mutex }

func (o *out) line(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...) // unbuffered: one write(2)
}

func candidateMain() int {
	o := &out{}
	env := func(k string) string { return os.Getenv(k) }
	ttlMs, _ := strconv.Atoi(env(envTTL))
	everyMs, _ := strconv.Atoi(env(envEvery))
	ttl, every := time.Duration(ttlMs)*time.Millisecond, time.Duration(everyMs)*time.Millisecond
	key, id, reg := env(envKey), env(envID), env(envRegister)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()

	log, stopLog := debugLogger(id)
	defer stopLog()
	b, sessionInfo, closeB, err := dialCandidate(ctx, env(envBackend), strings.Split(env(envEndpoints), ","), ttl, log)
	if err != nil {
		o.line("EXIT %d dial:%s", mono(), word(err))
		return 1
	}
	defer closeB()
	noDeadline := env(envBroken) == brokenNoDeadline
	stall := env(envBroken) == brokenStall
	e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: ttl}, election.WithLogger(log))
	if err != nil {
		o.line("EXIT %d config:%s", mono(), word(err))
		return 1
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var ops atomic.Int64
	write := func(tok uint64, val string) {
		op := ops.Add(1)
		o.line("W %d %d %s %d", op, tok, val, mono())
		q := url.Values{"key": {key}, "tok": {strconv.FormatUint(tok, 10)}, "val": {val}}
		resp, err := hc.Post(reg+"/w?"+q.Encode(), "text/plain", nil)
		res := "err"
		if err == nil {
			switch resp.StatusCode {
			case http.StatusOK:
				res = "ok"
			case http.StatusConflict:
				res = "stale"
			}
			resp.Body.Close()
		}
		o.line("WR %d %d %s", op, mono(), res)
	}
	read := func() {
		op := ops.Add(1)
		o.line("R %d %d", op, mono())
		resp, err := hc.Get(reg + "/r?" + url.Values{"key": {key}}.Encode())
		if err != nil {
			o.line("RR %d %d err", op, mono())
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		f := strings.Fields(string(body))
		if err != nil || resp.StatusCode != http.StatusOK || len(f) != 2 {
			o.line("RR %d %d err", op, mono())
			return
		}
		o.line("RR %d %d %s %s", op, mono(), f[0], f[1])
	}
	freeze := make(chan os.Signal, 1) // SIGUSR1: stop before the next write
	signal.Notify(freeze, syscall.SIGUSR1)
	resumed := make(chan os.Signal, 1)
	signal.Notify(resumed, syscall.SIGCONT)
	n := 0
	err = e.Run(ctx, tenure.Callbacks{
		OnElected: func(lctx context.Context, t tenure.Term) {
			o.line("ELECTED %d %d %s %s", t.Token, mono(), t.Entry, sessionInfo())
			if stall { // the broken variant: the term "ends", the entry stays
				stall = false
				o.line("WORKEND %d %d", t.Token, mono())
				select {
				case <-time.After(stallFor):
				case <-lctx.Done():
				}
				return
			}
			var ended atomic.Int64
			stop := context.AfterFunc(lctx, func() {
				ended.Store(mono())
				o.line("CTXEND %d %d %s", t.Token, mono(), word(context.Cause(lctx)))
			})
			defer stop()
			working := func() bool {
				if noDeadline { // the broken variant: 2·TTL more
					return lctx.Err() == nil || mono()-ended.Load() < int64(2*ttl)
				}
				return lctx.Err() == nil
			}
			// The leader's work: check the context, do some work (a read
			// every fourth round, the sleep), write with the term. A pause
			// between the check and the write (a GC pause, SIGSTOP) is
			// Kleppmann's case: only the register's fence stops that
			// write. The stop scenario asks for that pause with SIGUSR1,
			// and the process stops itself in the sleep, so the pause
			// falls between the check and the write whenever the signal
			// arrives; a SIGSTOP sent from outside on seeing a write's
			// answer could land in the next read or write instead, and on
			// waking the check would end the work first, leaving the fence
			// unexercised.
			for working() {
				if n > 0 && n%4 == 0 {
					read()
				}
				select {
				case <-time.After(every):
				case <-freeze:
					o.line("FREEZE %d", mono())
					select { // an earlier resumption's
					case <-resumed:
					default:
					}
					// kill(2) returns before every thread has stopped:
					// wait for the SIGCONT that ends the stop, so that
					// nothing runs between the stop and the write.
					_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
					<-resumed
				}
				n++
				write(t.Token, fmt.Sprintf("%s#%d", id, n))
			}
			o.line("WORKEND %d %d", t.Token, mono())
		},
		OnHardStop: func(t tenure.Term) { o.line("HARDSTOP %d %d", t.Token, mono()) },
	})
	_ = e.Close(context.Background())
	if zb, ok := b.(*zkelect.Backend); ok {
		if n, lerr := ownNodes(zb.Conn(), key, 2*time.Second); lerr == nil {
			o.line("LEFT %d %d", n, mono())
		} else {
			o.line("LEFTERR %d %s", mono(), word(lerr))
		}
	}
	o.line("EXIT %d %s", mono(), word(err))
	if errors.Is(err, tenure.ErrCanceled) {
		return 0
	}
	return 1
}

// dialCandidate connects to a backend as a candidate process does, retrying
// until ctx ends (the servers may be restarting). sessionInfo returns what
// the checker needs to expire the session from outside ("" for etcd, whose
// entry name holds its lease).
func dialCandidate(ctx context.Context, backend string, endpoints []string, ttl time.Duration, log *zap.Logger) (b election.Backend, sessionInfo func() string, closeB func(), err error) {
	for {
		b, sessionInfo, closeB, err = dialOnce(ctx, backend, endpoints, ttl, log)
		if err == nil || ctx.Err() != nil || errors.Is(err, errNoBackend) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func dialOnce(ctx context.Context, backend string, endpoints []string, ttl time.Duration, log *zap.Logger) (election.Backend, func() string, func(), error) {
	switch backend {
	case "etcd":
		cli, err := clientv3.New(clientv3.Config{
			Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
			DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second,
		})
		if err != nil {
			return nil, nil, nil, err
		}
		var opts []etcdelect.Option
		if os.Getenv(envHandover) == "1" {
			opts = append(opts, etcdelect.WithHandoverRecords(1))
		}
		return etcdelect.New(cli, opts...), func() string { return "" }, func() { cli.Close() }, nil
	case "zookeeper":
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		opts := []zkelect.Option{zkelect.WithLogger(log)}
		if os.Getenv(envHandover) == "1" {
			opts = append(opts, zkelect.WithHandoverRecords(1))
		}
		b, err := zkelect.Dial(dctx, endpoints, ttl, opts...)
		if err != nil {
			return nil, nil, nil, err
		}
		info := func() string {
			id, pw := zkSession(b.Conn())
			return fmt.Sprintf("%d %s", id, hex.EncodeToString(pw))
		}
		return b, info, b.Close, nil
	case "redis":
		b, err := dialRedis(ctx, endpoints)
		if err != nil {
			return nil, nil, nil, err
		}
		return b, func() string { return "" }, func() { b.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("%w %q", errNoBackend, backend)
}

var errNoBackend = errors.New("chaos: no such backend")

// zkSession returns the connection's ZooKeeper session id and password.
// go-zookeeper does not export the password; the checker needs both to
// close the session from another connection, as Curator's KillSession
// does, which is how a test forces a ZooKeeper session to expire.
func zkSession(c *zk.Conn) (int64, []byte) {
	pw := reflect.ValueOf(c).Elem().FieldByName("passwd").Bytes()
	return c.SessionID(), append([]byte(nil), pw...)
}

// ownNodes counts the nodes under key that the connection's current
// session owns, waiting up to wait from its first answered read for the
// count to reach 0 (the backend deletes some in the background), and up to
// 10 s for that read. After the elector's Close there should be none: one
// would be a node no campaign knows of, which the session keeps, at the
// head of the queue or on its way there, for as long as the process runs.
func ownNodes(c *zk.Conn, key string, wait time.Duration) (int, error) {
	var deadline time.Time
	giveUp := time.Now().Add(10 * time.Second)
	for {
		id := c.SessionID()
		children, _, err := c.Children(key)
		if errors.Is(err, zk.ErrNoNode) {
			return 0, nil
		}
		if err != nil {
			if time.Now().After(giveUp) {
				return 0, err
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(wait)
		}
		n := 0
		var lookErr error
		for _, ch := range children {
			ok, st, err := c.Exists(key + "/" + ch)
			if err != nil {
				lookErr = err
				break
			}
			if ok && st.EphemeralOwner == id {
				n++
			}
		}
		if lookErr != nil { // a lost connection: count again, as for Children
			if time.Now().After(giveUp) {
				return 0, lookErr
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}
