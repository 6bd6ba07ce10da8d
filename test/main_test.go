// Package test holds tenure's cross-implementation benchmarks, run against
// one embedded etcd server shared by the whole package.
package test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure/internal/etcdembed"
)

// endpoint is the client address (host:port) of the package's embedded etcd.
var endpoint string

func TestMain(m *testing.M) {
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
	code := m.Run()
	srv.Close()
	os.RemoveAll(dir)

	// Every client, session and elector a benchmark starts must be gone by
	// now, and so must the embedded server's goroutines: embed.Etcd.Close
	// waits for all of them (checked with this etcd version, v3.7.3), so no
	// goroutine is ignored here.
	if err := goleak.Find(); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}
