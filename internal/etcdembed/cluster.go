package etcdembed

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/testnet"
)

// Cluster is a multi-member etcd cluster, every member embedded in this
// process on its own loopback ports and data directory, for the
// fault-injection tests: a member can be stopped abruptly (no leadership
// transfer, as if its process died) and restarted from its data. Members
// are indexed from 0. Its methods are safe for concurrent use. Stop it with
// Close.
type Cluster struct {
	tickMs, electionMs uint
	initial            string // the initial-cluster string

	mu      sync.Mutex
	members []*member
	closed  bool
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	e         *embed.Etcd // nil while stopped
	everReady bool
}

// StartCluster starts n members under dir (member i in dir/m<i>) with the
// given heartbeat and election timeout in milliseconds, and returns once
// the cluster has a leader and every member serves. etcd's minimum lease
// TTL is 1.5 election timeouts, rounded up to whole seconds.
func StartCluster(dir string, n int, tickMs, electionMs uint) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdembed: cluster of %d members", n)
	}
	ports, err := testnet.FreePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{tickMs: tickMs, electionMs: electionMs}
	var initial []string
	for i := range n {
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       fmt.Sprintf("%s/m%d", dir, i),
			clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])},
			peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])},
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	c.initial = strings.Join(initial, ",")
	c.mu.Lock()
	defer c.mu.Unlock()
	// Every member must be starting before any can be ready: start them
	// together, then wait.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.members {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.launch(m) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.closeLocked()
		return nil, err
	}
	for _, m := range c.members {
		if err := c.ready(m); err != nil {
			c.closeLocked()
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) launch(m *member) error {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{m.clientURL}, []url.URL{m.clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{m.peerURL}, []url.URL{m.peerURL}
	cfg.InitialCluster = c.initial
	cfg.InitialClusterToken = "tenure-cluster"
	cfg.TickMs, cfg.ElectionMs = c.tickMs, c.electionMs
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdembed: start member %s: %w", m.name, err)
	}
	m.e = e
	return nil
}

func (c *Cluster) ready(m *member) error {
	select {
	case <-m.e.Server.ReadyNotify():
		return nil
	case err := <-m.e.Err():
		return fmt.Errorf("etcdembed: member %s: %w", m.name, err)
	case <-time.After(30 * time.Second):
		return fmt.Errorf("etcdembed: member %s not ready after 30s", m.name)
	}
}

// Len is the number of members, running or not.
func (c *Cluster) Len() int { return len(c.members) }

// Endpoints returns every member's client address (host:port), running or
// not, in index order.
func (c *Cluster) Endpoints() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL.Host
	}
	return out
}

// Running reports whether member i runs.
func (c *Cluster) Running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].e != nil
}

// Leader returns the index of the running member that is the raft leader,
// as the running members see it; it fails when they see none, or disagree.
func (c *Cluster) Leader() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	leader := -1
	for _, m := range c.members {
		if m.e == nil {
			continue
		}
		lead := uint64(m.e.Server.Leader())
		for j, o := range c.members {
			if lead != 0 && o.e != nil && uint64(o.e.Server.MemberID()) == lead {
				if leader >= 0 && leader != j {
					return -1, fmt.Errorf("etcdembed: members disagree on the leader (%d and %d)", leader, j)
				}
				leader = j
			}
		}
	}
	if leader < 0 {
		return -1, errors.New("etcdembed: no running member leads")
	}
	return leader, nil
}

// WaitLeader polls Leader until it answers or timeout passes.
func (c *Cluster) WaitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		i, err := c.Leader()
		if err == nil || time.Now().After(deadline) {
			return i, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop stops member i abruptly: its raft node halts without handing over
// leadership (as when its process dies), then its listeners close. Its data
// stay, for Restart. It fails if the member is not running.
func (c *Cluster) Stop(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) || c.closed {
		return fmt.Errorf("etcdembed: no member %d", i)
	}
	m := c.members[i]
	if m.e == nil {
		return fmt.Errorf("etcdembed: member %d is not running", i)
	}
	stop(m)
	return nil
}

// stop halts m's raft node first, so that Close finds a follower-less
// stopped server and transfers nothing, then closes the rest.
func stop(m *member) {
	m.e.Server.HardStop()
	m.e.Close()
	m.e = nil
}

// Restart starts member i again from its data, on the same ports, stopping
// it first if it runs. When a quorum of members runs, it waits until the
// member serves; otherwise it returns once the member is started.
func (c *Cluster) Restart(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.members) || c.closed {
		return fmt.Errorf("etcdembed: no member %d", i)
	}
	m := c.members[i]
	if m.e != nil {
		stop(m)
	}
	if err := c.launch(m); err != nil {
		return err
	}
	running := 0
	for _, o := range c.members {
		if o.e != nil {
			running++
		}
	}
	if running > len(c.members)/2 {
		return c.ready(m)
	}
	return nil
}

// RestartAll stops every running member abruptly, then starts them all
// again together and waits until they serve: a full cluster restart.
func (c *Cluster) RestartAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("etcdembed: cluster closed")
	}
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m.e != nil {
			wg.Add(1)
			go func() { defer wg.Done(); stop(m) }()
		}
	}
	wg.Wait()
	errs := make([]error, len(c.members))
	for i, m := range c.members {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.launch(m) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, m := range c.members {
		if err := c.ready(m); err != nil {
			return err
		}
	}
	return nil
}

// Close stops every member and waits for them. It is idempotent.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeLocked()
}

func (c *Cluster) closeLocked() {
	c.closed = true
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m.e != nil {
			wg.Add(1)
			go func() { defer wg.Done(); m.e.Close(); m.e = nil }()
		}
	}
	wg.Wait()
}
