// Package test holds tenure's cross-implementation benchmarks, run against
// one embedded etcd server and one standalone ZooKeeper server (a child
// java process, internal/zkserver) shared by the whole package.
package test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/redisserver"
	"github.com/tenure-go/tenure/internal/zkserver"
)

// endpoint is the client address (host:port) of the package's embedded etcd.
var endpoint string

// zkEndpoints are the client addresses (host:port) of the package's
// standalone ZooKeeper server.
var zkEndpoints []string

// zkEnsemble is that server (for its process id: the benchmarks read its
// CPU time).
var zkEnsemble *zkserver.Ensemble

func TestMain(m *testing.M) {
	if id := os.Getenv(tickerEnv); id != "" {
		os.Exit(tickerMain(id)) // the command a failover benchmark's holder runs
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "tenure-test-etcd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	srv, err := etcdembed.Start(dir)
	if err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "embedded etcd:", err)
		return 1
	}
	endpoint = srv.Endpoint

	// One standalone ZooKeeper server, which grants session timeouts up to
	// 20 s (the ZooKeeper benchmarks use 10 s). Its java process gets
	// SIGKILL if this process dies first.
	zkDir, err := os.MkdirTemp("", "tenure-test-zk-")
	if err != nil {
		srv.Close()
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	zks, err := zkserver.Start(zkDir, zkserver.Options{Servers: 1, MaxSessionTimeout: 20 * time.Second})
	if err != nil {
		srv.Close()
		os.RemoveAll(dir)
		os.RemoveAll(zkDir)
		fmt.Fprintln(os.Stderr, "zookeeper:", err)
		return 1
	}
	zkEndpoints, zkEnsemble = zks.Endpoints(), zks

	// One redis-server (persistence off), for the Redis benchmarks.
	redisDir, err := os.MkdirTemp("", "tenure-test-redis-")
	if err != nil {
		zks.Close()
		srv.Close()
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(redisDir)
	rs, err := redisserver.Start(redisDir, redisserver.Options{})
	if err != nil {
		zks.Close()
		srv.Close()
		fmt.Fprintln(os.Stderr, "redis:", err)
		return 1
	}
	redisEndpoint = rs.Addr()

	code := m.Run()
	removeTools()
	rs.Close()
	zks.Close()
	os.RemoveAll(zkDir)
	srv.Close()
	os.RemoveAll(dir)

	// Every client, session and elector a benchmark starts must be gone by
	// now, and so must the embedded server's goroutines: embed.Etcd.Close
	// waits for all of them (checked with this etcd version, v3.7.3), and
	// zkserver.Ensemble.Close waits for its servers' processes, so no
	// goroutine is ignored here. (go-zookeeper's Conn.Close does not wait
	// for its connection's goroutines, but they end within a few
	// milliseconds; goleak.Find retries for a while before it reports.)
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
