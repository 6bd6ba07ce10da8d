package testnet

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestFreePorts_OutsideTheEphemeralRange: the ports handed out are
// distinct and outside the kernel's ephemeral range, so that a server
// restarted on its port does not find it taken by an outgoing connection.
func TestFreePorts_OutsideTheEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skipf("no ephemeral range to check against: %v", err)
	}
	f := strings.Fields(string(b))
	lo, _ := strconv.Atoi(f[0])
	hi, _ := strconv.Atoi(f[1])
	if lo-10000 < 1000 && 65535-hi < 1000 {
		t.Skipf("the ephemeral range %d-%d leaves no room outside it", lo, hi)
	}
	ports, err := FreePorts(50)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p >= lo && p <= hi {
			t.Errorf("port %d is in the ephemeral range %d-%d", p, lo, hi)
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
