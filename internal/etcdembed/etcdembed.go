// Package etcdembed starts embedded etcd servers on free loopback ports,
// for tenure's tests, benchmarks and demo: a single member (Start) or a
// cluster of n members (StartCluster).
package etcdembed

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/testnet"
)

// Server is a running embedded etcd member. Stop it with Close.
type Server struct {
	e *embed.Etcd
	// Endpoint is the client URL host:port.
	Endpoint string
}

// Start runs an etcd member with its data in dir. The heartbeat is 10 ms and
// the election timeout 100 ms, which brings the server's minimum lease TTL
// down to 1 s (etcd's default settings make it 2 s).
func Start(dir string) (*Server, error) { return StartTimed(dir, 10, 100) }

// StartTimed is Start with the given heartbeat and election timeout in
// milliseconds. etcd's defaults are 100 and 1000.
func StartTimed(dir string, tickMs, electionMs uint) (*Server, error) {
	// Another process may bind a port between its choice and the start
	// (the test packages run side by side): choose again.
	for attempt := 0; ; attempt++ {
		s, err := startTimed(dir, tickMs, electionMs)
		if err == nil || !strings.Contains(err.Error(), "address already in use") || attempt == 2 {
			return s, err
		}
	}
}

func startTimed(dir string, tickMs, electionMs uint) (*Server, error) {
	ports, err := testnet.FreePorts(2)
	if err != nil {
		return nil, err
	}
	cport, pport := ports[0], ports[1]
	cfg := embed.NewConfig()
	cfg.Name = "tenure"
	cfg.Dir = dir
	cu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = tickMs, electionMs
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd failed before it was ready: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	return &Server{e: e, Endpoint: cu.Host}, nil
}

// Close stops the member and waits for it.
func (s *Server) Close() { s.e.Close() }
