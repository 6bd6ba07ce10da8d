// Package testnet holds what tenure's throwaway test servers share: free
// loopback ports that this process never hands out twice, and the tail of a
// server's log for error messages.
package testnet

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
)

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{} // handed out by this process, never again
)

// FreePorts returns n distinct free loopback ports, holding all of them
// bound until it has them all, and none it returned before (to any caller
// in this process). Safe for concurrent use.
func FreePorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, errors.New("testnet: cannot find free loopback ports")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testnet: find a free port: %w", err)
		}
		ls = append(ls, l)
		p := l.Addr().(*net.TCPAddr).Port
		if portsUsed[p] {
			continue
		}
		portsUsed[p] = true
		ports = append(ports, p)
	}
	return ports, nil
}

// LogTail returns the last lines (at most 30, 4 KiB) of the log at path,
// reading from byte offset on.
func LogTail(path string, offset int64) string {
	const maxBytes, maxLines = 4096, 30
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if offset > 0 && offset <= int64(len(b)) {
		b = b[offset:]
	}
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return strings.Join(lines, "\n")
}
