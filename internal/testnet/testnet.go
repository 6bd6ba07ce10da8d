// Package testnet holds what tenure's throwaway test servers share: free
// loopback ports that this process never hands out twice, and the tail of a
// server's log for error messages.
package testnet

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
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
//
// The ports are outside the kernel's ephemeral range (where it can): a
// server that a test stops and starts again on its port (a restarted
// etcd member, ZooKeeper or Redis server) must find it free, and a port
// from that range can meanwhile become some outgoing connection's local
// port ("bind: address already in use", seen in the chaos suite).
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
		l, err := listenOutsideEphemeral()
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

// listenOutsideEphemeral listens on a loopback port outside the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), picked at random, or, if
// none of a few tries is free or the range leaves no room, on any port.
func listenOutsideEphemeral() (net.Listener, error) {
	lo, hi := 32768, 60999 // Linux's default range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if l, err1 := strconv.Atoi(f[0]); err1 == nil {
				if h, err2 := strconv.Atoi(f[1]); err2 == nil && l <= h {
					lo, hi = l, h
				}
			}
		}
	}
	// Below the range from 10000 (clear of well-known services), else
	// above it.
	first, last := 10000, lo-1
	if last-first < 1000 {
		first, last = hi+1, 65535
	}
	if last-first >= 1000 {
		for range 50 {
			p := first + rand.IntN(last-first+1)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
				return l, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}
