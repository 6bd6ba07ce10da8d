package chaos

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/zkserver"
)

// backend is one row of the harness's table. A new backend (Redis) is one
// more row: a start function for its servers and, in candidate_test.go, a
// case in dialOnce.
type backend struct {
	name string
	// linearizable backends must pass every invariant; the others (Redis)
	// are run and reported as efficiency-only: their overlap and stale-token
	// findings are counted apart and do not fail the run.
	linearizable bool
	start        func(dir string) (servers, error)
	// unsupported names the scenarios the backend has no form of.
	unsupported []string
}

// servers is a running server cluster of one backend, as the harness drives
// it. Methods return errUnsupported for faults the backend has no form of.
type servers interface {
	// Endpoints are the client addresses the candidates' proxies forward to.
	Endpoints() []string
	// ExpiryGranularity is how late after the TTL the server may expire a
	// session (etcd's lessor checks every 500 ms; ZooKeeper expires in
	// tickTime buckets).
	ExpiryGranularity() time.Duration
	// ServerFailover bounds a server-side leader change, including the
	// clients' reconnection: the time a leader's session may have been
	// unable to renew on top of a crash.
	ServerFailover() time.Duration
	// KillLeader kills the server-side leader and returns a function that
	// brings it back.
	KillLeader() (restore func() error, err error)
	// RestartAll kills every server and starts them again from their data;
	// it returns when they serve.
	RestartAll() error
	// Expire ends the session that holds term t on the server, from
	// outside the candidate (etcd: revoke its lease; ZooKeeper: close its
	// session from another connection).
	Expire(t *termInfo) error
	// Entries returns how many entries (etcd keys, znodes) are left under
	// an election key.
	Entries(key string) (int, error)
	// Holder returns the token of the entry that holds key on the server
	// (0 when none does): what a leader that keeps its term through a
	// fault must still be.
	Holder(key string) (uint64, error)
	// Isolate cuts one follower server off from the other servers (its
	// clients still reach it), the one most of the sessions given are
	// connected to, and returns its index (in Endpoints) and a function
	// that heals the links and waits for the server to serve again.
	Isolate(sessions []int64) (server, onIt int, undo func() error, err error)
	// LeaderChanges counts the server-side leader changes seen so far
	// (0 when the backend cannot tell). A new server-side leader renews
	// every session (etcd extends every lease by its TTL plus an election
	// timeout when a member becomes leader), which postpones a crashed
	// holder's expiry.
	LeaderChanges() float64
	// Diagnose describes the key's queue and the servers' sessions, for
	// the log when a lane has no leader.
	Diagnose(key string) string
	Close()
}

var errUnsupported = errors.New("chaos: fault not supported by this backend")

const (
	// etcd members tick every 50 ms with a 500 ms election timeout: a
	// raft leader change takes about 0.5–1 s, and the minimum lease TTL is
	// 1 s.
	etcdTickMs, etcdElectionMs = 50, 500
	zkTick                     = 100 * time.Millisecond
)

var backends = []backend{
	// etcd members are not partitioned: a lease keep-alive is answered by
	// the raft leader, so a member cut off from it cannot renew anything.
	{name: "etcd", linearizable: true, start: startEtcd, unsupported: []string{"partition"}},
	{name: "zookeeper", linearizable: true, start: startZK},
	{name: "redis", linearizable: false, start: startRedis, unsupported: []string{"expire", "leaderkill", "partition"}},
}

// ---- etcd: three embedded members ----

type etcdServers struct {
	c     *etcdembed.Cluster
	admin *clientv3.Client
}

func startEtcd(dir string) (servers, error) {
	c, err := etcdembed.StartCluster(filepath.Join(dir, "etcd"), 3, etcdTickMs, etcdElectionMs)
	if err != nil {
		return nil, err
	}
	admin, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.Close()
		return nil, err
	}
	return &etcdServers{c: c, admin: admin}, nil
}

func (s *etcdServers) Endpoints() []string { return s.c.Endpoints() }

func (s *etcdServers) ExpiryGranularity() time.Duration { return 500 * time.Millisecond }

// ServerFailover: a raft election (about two election timeouts under
// load), plus the election timeout by which etcd extends every lease when
// a new leader takes over, plus the client's switch to another member.
func (s *etcdServers) ServerFailover() time.Duration {
	return 3*etcdElectionMs*time.Millisecond + time.Second
}

func (s *etcdServers) KillLeader() (func() error, error) {
	i, err := s.c.WaitLeader(10 * time.Second)
	if err != nil {
		return nil, err
	}
	if err := s.c.Stop(i); err != nil {
		return nil, err
	}
	return func() error { return s.c.Restart(i) }, nil
}

func (s *etcdServers) RestartAll() error { return s.c.RestartAll() }

func (s *etcdServers) Isolate([]int64) (int, int, func() error, error) {
	return 0, 0, nil, errUnsupported
}

func (s *etcdServers) Expire(t *termInfo) error {
	i := strings.LastIndexByte(t.entry, '/')
	id, err := strconv.ParseInt(t.entry[i+1:], 16, 64)
	if i < 0 || err != nil {
		return fmt.Errorf("chaos: no lease in entry %q", t.entry)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = s.admin.Revoke(ctx, clientv3.LeaseID(id))
	return err
}

// Holder: the key with the smallest create revision under the prefix (the
// concurrency package's order), whose create revision is the token.
func (s *etcdServers) Holder(key string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.admin.Get(ctx, key+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(r.Kvs) == 0 {
		return 0, err
	}
	return uint64(r.Kvs[0].CreateRevision), nil
}

func (s *etcdServers) Entries(key string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.admin.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(r.Count), nil
}

// LeaderChanges reads etcd's etcd_server_leader_changes_seen_total, which
// the embedded members register on the default Prometheus registry (their
// counts add up: a change seen by three members counts three).
func (s *etcdServers) LeaderChanges() float64 {
	mfs, _ := prometheus.DefaultGatherer.Gather() // what it gathered, even if another collector failed
	for _, mf := range mfs {
		if mf.GetName() == "etcd_server_leader_changes_seen_total" {
			n := 0.0
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
			return n
		}
	}
	return 0
}

func (s *etcdServers) Diagnose(key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := s.admin.Get(ctx, key+"/", clientv3.WithPrefix())
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "etcd %s at revision %d:", key, r.Header.Revision)
	for _, kv := range r.Kvs {
		ttl, err := s.admin.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		left := "?"
		if err == nil {
			left = fmt.Sprintf("%ds", ttl.TTL)
		}
		fmt.Fprintf(&b, "\n  %s = %s (create rev %d, lease %x, %s left)", kv.Key, kv.Value, kv.CreateRevision, kv.Lease, left)
	}
	return b.String()
}

func (s *etcdServers) Close() {
	s.admin.Close()
	s.c.Close()
}

// ---- ZooKeeper: a three-server ensemble ----

type zkServers struct {
	e     *zkserver.Ensemble
	admin *zk.Conn
}

func startZK(dir string) (servers, error) {
	e, err := zkserver.Start(filepath.Join(dir, "zk"), zkserver.Options{Servers: 3, TickTime: zkTick, MaxSessionTimeout: 20 * time.Second, Partitionable: true})
	if err != nil {
		return nil, err
	}
	admin, _, err := zk.Connect(e.Endpoints(), 10*time.Second, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		e.Close()
		return nil, err
	}
	return &zkServers{e: e, admin: admin}, nil
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

func (s *zkServers) Endpoints() []string { return s.e.Endpoints() }

func (s *zkServers) ExpiryGranularity() time.Duration { return zkTick }

// ServerFailover: the ensemble elects a new leader (0.4–0.7 s measured,
// docs/zookeeper.md; more under load), and go-zookeeper reconnects,
// pausing 1 s after it has tried every server.
func (s *zkServers) ServerFailover() time.Duration { return 3 * time.Second }

func (s *zkServers) KillLeader() (func() error, error) {
	var i int
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if i, err = s.e.Leader(); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return nil, err
	}
	if err := s.e.Kill(i); err != nil {
		return nil, err
	}
	return func() error { return s.e.Restart(i) }, nil
}

func (s *zkServers) Isolate(sessions []int64) (int, int, func() error, error) {
	leader, err := s.e.Leader()
	if err != nil {
		return 0, 0, nil, err
	}
	want := make(map[int64]bool, len(sessions))
	for _, id := range sessions {
		want[id] = true
	}
	pick, most := -1, -1
	for i := range s.e.Len() {
		if i == leader {
			continue
		}
		ids, err := s.e.Sessions(i)
		if err != nil {
			return 0, 0, nil, err
		}
		n := 0
		for _, id := range ids {
			if want[id] {
				n++
			}
		}
		if n > most {
			pick, most = i, n
		}
	}
	if err := s.e.Isolate(pick); err != nil {
		return 0, 0, nil, err
	}
	return pick, most, func() error {
		if err := s.e.Rejoin(pick); err != nil {
			return err
		}
		for deadline := time.Now().Add(30 * time.Second); s.e.Mode(pick) != "follower"; {
			if time.Now().After(deadline) {
				return fmt.Errorf("chaos: server %d not following 30s after it rejoined (mode %q)", pick, s.e.Mode(pick))
			}
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	}, nil
}

func (s *zkServers) RestartAll() error {
	for i := range s.e.Len() {
		_ = s.e.Kill(i) // fails only for a server already down
	}
	for i := range s.e.Len() {
		if err := s.e.Restart(i); err != nil {
			return err
		}
	}
	return nil
}

func (s *zkServers) Expire(t *termInfo) error {
	if t.zkSession == 0 {
		return fmt.Errorf("chaos: term %d has no ZooKeeper session", t.token)
	}
	var errs []error
	for _, ep := range s.e.Endpoints() { // any server that answers
		err := closeZKSession(ep, t.zkSession, t.zkPassword)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// zkAdminTimeout bounds each of the checker's ZooKeeper reads: go-zookeeper
// calls take no deadline, and one queued while no server answers (a
// restart, a killed leader) waits until the client gives up on every
// server.
const zkAdminTimeout = 5 * time.Second

// bounded runs f, a go-zookeeper call, and gives up waiting for it after d
// (the call itself runs on until the client answers it).
func bounded[T any](d time.Duration, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-t.C:
		var zero T
		return zero, fmt.Errorf("chaos: zookeeper admin read: no answer in %v", d)
	}
}

// children reads key's children within zkAdminTimeout.
func (s *zkServers) children(key string) ([]string, error) {
	return bounded(zkAdminTimeout, func() ([]string, error) {
		c, _, err := s.admin.Children(key)
		return c, err
	})
}

// Holder: the child with the lowest sequence, whose czxid is the token.
func (s *zkServers) Holder(key string) (uint64, error) {
	children, err := s.children(key)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var head string
	for _, c := range children {
		i := strings.LastIndex(c, "-lock-")
		if i < 0 {
			continue
		}
		if head == "" || c[i+6:] < head[strings.LastIndex(head, "-lock-")+6:] {
			head = c
		}
	}
	if head == "" {
		return 0, nil
	}
	st, err := bounded(zkAdminTimeout, func() (*zk.Stat, error) {
		ok, st, err := s.admin.Exists(key + "/" + head)
		if !ok {
			st = nil
		}
		return st, err
	})
	if err != nil || st == nil {
		return 0, err
	}
	return uint64(st.Czxid), nil
}

func (s *zkServers) Entries(key string) (int, error) {
	children, err := s.children(key)
	if errors.Is(err, zk.ErrNoNode) {
		return 0, nil
	}
	return len(children), err
}

// LeaderChanges is 0: the harness does not track the ensemble's
// elections (ZooKeeper's sessions are not renewed by one either: the new
// leader counts each session's timeout afresh, which the server failover
// bound covers).
func (s *zkServers) LeaderChanges() float64 { return 0 }

func (s *zkServers) Diagnose(key string) string {
	var b strings.Builder
	children, err := s.children(key)
	fmt.Fprintf(&b, "zookeeper %s: children %v (err %v)", key, children, err)
	type node struct {
		data []byte
		st   *zk.Stat
	}
	for _, c := range children {
		n, err := bounded(zkAdminTimeout, func() (node, error) {
			data, st, err := s.admin.Get(key + "/" + c)
			return node{data, st}, err
		})
		if err != nil {
			fmt.Fprintf(&b, "\n  %s: %v", c, err)
			continue
		}
		fmt.Fprintf(&b, "\n  %s = %s (czxid %d, owner %#x)", c, n.data, n.st.Czxid, n.st.EphemeralOwner)
	}
	for i, ep := range s.e.Endpoints() {
		c, err := net.DialTimeout("tcp", ep, time.Second)
		if err != nil {
			fmt.Fprintf(&b, "\n-- server %d: %v", i, err)
			continue
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = io.WriteString(c, "dump")
		out, _ := io.ReadAll(c)
		c.Close()
		fmt.Fprintf(&b, "\n-- server %d dump:\n%s", i, out)
	}
	return b.String()
}

func (s *zkServers) Close() {
	s.admin.Close()
	s.e.Close()
}

// closeZKSession attaches to session id with its password on a new
// connection to addr and closes it, which expires it for its owner: the
// server deletes its ephemeral nodes at once, and the owner learns on its
// next reconnection that the session has expired (Curator's KillSession
// does the same). go-zookeeper cannot connect to an existing session, so
// this speaks the wire protocol: a ConnectRequest, then a closeSession
// request (opcode -11).
func closeZKSession(addr string, id int64, passwd []byte) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	// ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId,
	// passwd (length-prefixed), readOnly.
	req := binary.BigEndian.AppendUint32(nil, 0)
	req = binary.BigEndian.AppendUint64(req, 0)
	req = binary.BigEndian.AppendUint32(req, 10000)
	req = binary.BigEndian.AppendUint64(req, uint64(id))
	req = binary.BigEndian.AppendUint32(req, uint32(len(passwd)))
	req = append(req, passwd...)
	req = append(req, 0)
	if err := writeFrame(c, req); err != nil {
		return err
	}
	resp, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("zookeeper %s: attach to session %#x: %w", addr, id, err)
	}
	if len(resp) < 16 {
		return fmt.Errorf("zookeeper %s: short connect response", addr)
	}
	timeout, got := int32(binary.BigEndian.Uint32(resp[4:8])), int64(binary.BigEndian.Uint64(resp[8:16]))
	if timeout <= 0 {
		return nil // already expired
	}
	if got != id {
		return fmt.Errorf("zookeeper %s: attached to session %#x, asked %#x", addr, got, id)
	}
	// RequestHeader: xid, type = closeSession.
	req = binary.BigEndian.AppendUint32(nil, 1)
	req = binary.BigEndian.AppendUint32(req, uint32(0xFFFFFFF5)) // -11
	if err := writeFrame(c, req); err != nil {
		return err
	}
	for {
		resp, err := readFrame(c)
		if err != nil {
			return fmt.Errorf("zookeeper %s: close session %#x: %w", addr, id, err)
		}
		// ReplyHeader: xid, zxid, err. Skip notifications (xid -1) and
		// ping replies (xid -2).
		if len(resp) >= 16 && int32(binary.BigEndian.Uint32(resp[0:4])) == 1 {
			if code := int32(binary.BigEndian.Uint32(resp[12:16])); code != 0 {
				return fmt.Errorf("zookeeper %s: close session %#x: error %d", addr, id, code)
			}
			return nil
		}
	}
}

func writeFrame(w io.Writer, b []byte) error {
	_, err := w.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...))
	return err
}

func readFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err := io.ReadFull(r, b)
	return b, err
}

// parseZKSession parses the "<id> <password hex>" an ELECTED line carries.
func parseZKSession(id, pw string) (int64, []byte) {
	n, err1 := strconv.ParseInt(id, 10, 64)
	b, err2 := hex.DecodeString(pw)
	if err1 != nil || err2 != nil {
		return 0, nil
	}
	return n, b
}
