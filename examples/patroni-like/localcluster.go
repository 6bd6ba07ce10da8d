package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

// This file runs a whole cluster on one machine, for --demo and the tests:
// an embedded etcd, and one manager process per member, each reaching etcd
// through its own fault-injecting proxy (as if over its own network link).

// Event is one line of a manager's log that carries an "event" field.
type Event struct {
	At     time.Time `json:"ts"`
	Event  string    `json:"event"`
	Node   string    `json:"node"`
	Term   uint64    `json:"term"`
	Cause  string    `json:"cause"`
	Reason string    `json:"reason"`
	// Drained: a fenced event's clean shutdown finished in time, so its
	// standbys confirmed every commit of the term (Postgres.Fence).
	Drained bool `json:"drained"`
	// Took: how long a fenced event's fence took, in seconds.
	Took float64 `json:"took"`
	// To: the member a yield event deferred to.
	To string `json:"to"`
}

// localCluster is a cluster of manager processes on loopback. Its methods
// are safe for concurrent use.
type localCluster struct {
	dir     string
	etcd    *etcdembed.Server
	cfgs    []Config
	proxies map[string]*faultproxy.Proxy
	launch  func(cfgPath string) *exec.Cmd
	onEvent func(Event)
	http    *http.Client

	closeOnce sync.Once

	mu     sync.Mutex
	procs  map[string]*managerProc
	events []Event
}

type managerProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and its output is read
}

// newLocalCluster starts an embedded etcd in dir and writes the
// configuration of n members (node1…nodeN) with the given TTL and loop
// wait; it starts no manager. launch makes the command that runs a manager
// on a configuration file; onEvent, if set, sees every event as it comes.
func newLocalCluster(dir string, n int, ttl, loopWait time.Duration, launch func(string) *exec.Cmd, onEvent func(Event)) (*localCluster, error) {
	srv, err := etcdembed.Start(filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	c := &localCluster{dir: dir, etcd: srv, proxies: map[string]*faultproxy.Proxy{}, launch: launch, onEvent: onEvent,
		procs: map[string]*managerProc{}, http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	// The proxies first: they listen on ports the system picks, which must
	// not be among those freePorts hands back unbound.
	for i := range n {
		p, err := faultproxy.New(srv.Endpoint)
		if err != nil {
			c.close()
			return nil, err
		}
		c.proxies[fmt.Sprintf("node%d", i+1)] = p
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		c.close()
		return nil, err
	}
	var members []Member
	for i := range n {
		members = append(members, Member{
			Name:     fmt.Sprintf("node%d", i+1),
			API:      fmt.Sprintf("127.0.0.1:%d", ports[2*i]),
			Postgres: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1]),
		})
	}
	for _, m := range members {
		p := c.proxies[m.Name]
		cfg := Config{
			Name:  m.Name,
			Scope: "demo",
			DCS:   DCSConfig{Backend: "etcd", Endpoints: []string{p.Addr()}, TTL: ttl, LoopWait: loopWait},
			PostgreSQL: PostgreSQLConfig{
				DataDir: filepath.Join(dir, m.Name, "data"),
				// Throwaway data: no need to survive a machine crash.
				Parameters: map[string]string{"fsync": "off", "synchronous_commit": "off", "shared_buffers": "16MB"},
			},
			Members: members,
		}
		b, err := cfg.Marshal()
		if err == nil {
			err = os.WriteFile(c.configPath(m.Name), b, 0o644)
		}
		if err != nil {
			c.close()
			return nil, err
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	return c, nil
}

func (c *localCluster) configPath(name string) string { return filepath.Join(c.dir, name+".yaml") }

// managerLog is where a manager's output goes.
func (c *localCluster) managerLog(name string) string {
	return filepath.Join(c.dir, name+".manager.log")
}

func (c *localCluster) member(name string) Member { return c.cfgs[0].mustMember(name) }

func (c Config) mustMember(name string) Member {
	m, ok := c.Member(name)
	if !ok {
		panic("no member " + name)
	}
	return m
}

func (c *localCluster) names() []string {
	var out []string
	for _, m := range c.cfgs[0].Members {
		out = append(out, m.Name)
	}
	return out
}

// start runs the manager of member name.
func (c *localCluster) start(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[name]; p != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s's manager is running", name)
		}
	}
	logf, err := os.OpenFile(c.managerLog(name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := c.launch(c.configPath(name))
	// The manager dies with us; its PostgreSQL dies with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p := &managerProc{cmd: cmd, done: make(chan struct{})}
	c.procs[name] = p
	go func() {
		defer close(p.done)
		defer logf.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			var ev Event
			if json.Unmarshal(line, &ev) == nil && ev.Event != "" {
				if ev.Node == "" {
					ev.Node = name
				}
				c.mu.Lock()
				c.events = append(c.events, ev)
				c.mu.Unlock()
				if c.onEvent != nil {
					c.onEvent(ev)
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}()
	return nil
}

// kill SIGKILLs member name's manager and its PostgreSQL (every process of
// the postmaster's group), and waits for the manager to exit. It returns
// when both are gone.
func (c *localCluster) kill(name string) {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	if pid := c.postmasterPID(name); pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-p.done
}

// postmasterPID reads the pid of member name's postmaster, or 0.
func (c *localCluster) postmasterPID(name string) int {
	b, err := os.ReadFile(filepath.Join(c.dir, name, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// stop asks member name's manager to shut down (SIGTERM) and waits, killing
// it after grace.
func (c *localCluster) stop(name string, grace time.Duration) {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		c.kill(name)
	}
}

// close stops every manager, the proxies and etcd. It does not remove dir.
func (c *localCluster) close() { c.closeOnce.Do(c.closeNow) }

func (c *localCluster) closeNow() {
	var wg sync.WaitGroup
	for _, name := range c.namesStarted() {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(name, 20*time.Second) }()
	}
	wg.Wait()
	for _, p := range c.proxies {
		p.Close()
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	c.http.CloseIdleConnections()
}

func (c *localCluster) namesStarted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for n := range c.procs {
		out = append(out, n)
	}
	return out
}

// eventLog returns the events seen so far, in arrival order.
func (c *localCluster) eventLog() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Event(nil), c.events...)
}

// get calls GET path on member name's REST API.
func (c *localCluster) get(ctx context.Context, name, path string) (int, Status, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.member(name).API+path, nil)
	if err != nil {
		return 0, Status{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, Status{}, err
	}
	defer resp.Body.Close()
	var st Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	return resp.StatusCode, st, err
}

// clusterView calls GET /cluster on member name.
func (c *localCluster) clusterView(ctx context.Context, name string) (Cluster, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.member(name).API+"/cluster", nil)
	if err != nil {
		return Cluster{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Cluster{}, err
	}
	defer resp.Body.Close()
	var cl Cluster
	return cl, json.NewDecoder(resp.Body).Decode(&cl)
}

// primaries returns every member whose /primary answers 200, with its
// status.
func (c *localCluster) primaries(ctx context.Context) []Status {
	var out []Status
	for _, n := range c.names() {
		if code, st, err := c.get(ctx, n, "/primary"); err == nil && code == http.StatusOK {
			out = append(out, st)
		}
	}
	return out
}

// waitFor polls cond every 50 ms until it returns true or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if cond(ctx) {
			return nil
		}
		select {
		case <-ctx.Done():
			if err := context.Cause(ctx); !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s: %w", what, err) // the caller gave up (Ctrl-C), not the clock
			}
			return fmt.Errorf("%s: not within %v", what, timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitPrimary waits until exactly one member other than except answers 200
// on /primary, and returns its status.
func (c *localCluster) waitPrimary(ctx context.Context, timeout time.Duration, except string) (Status, error) {
	var got Status
	err := waitFor(ctx, timeout, "a primary", func(ctx context.Context) bool {
		ps := c.primaries(ctx)
		if len(ps) == 1 && ps[0].Name != except {
			got = ps[0]
			return true
		}
		return false
	})
	return got, err
}

// waitReplica waits until member name answers 200 on /replica.
func (c *localCluster) waitReplica(ctx context.Context, timeout time.Duration, name string) error {
	return waitFor(ctx, timeout, name+" streaming as a replica", func(ctx context.Context) bool {
		code, _, err := c.get(ctx, name, "/replica")
		return err == nil && code == http.StatusOK
	})
}

// connect opens a connection to member name's PostgreSQL.
func (c *localCluster) connect(ctx context.Context, name string) (*pgx.Conn, error) {
	return pgx.Connect(ctx, dsn(c.member(name).Postgres))
}

// freePorts returns n distinct free loopback ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
