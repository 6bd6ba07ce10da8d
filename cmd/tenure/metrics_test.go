package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// get returns the status code and body of http://addr/path, retrying
// until the server answers.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + path)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp.StatusCode, string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s%s: %v", addr, path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestExec_MetricsAddr: on the holder /leader is 200 and tenure_is_leader
// 1; on the waiter 503 and 0, and /status shows it queued.
func TestExec_MetricsAddr(t *testing.T) { eachBackend(t, testMetricsAddr) }

func testMetricsAddr(t *testing.T, v env) {
	key, dir := v.key(t), dirT(t)
	addrA, addrB := freeAddr(t), freeAddr(t)
	a := start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--metrics-addr", addrA, "--",
		"sh", "-c", `trap 'exit 0' TERM; echo $$ > `+path(dir, "a-pid")+`; while :; do sleep 0.01; done`)...)
	pidIn(t, path(dir, "a-pid"))
	start(t, append(append([]string{"exec"}, v.flags("")...), "--key", key, "--metrics-addr", addrB, "--", "true")...)
	v.waitQueued(t, key, 2)
	backend := map[string]string{"etcd": "etcd", "zk": "zookeeper"}[v.backend]
	series := fmt.Sprintf(`tenure_is_leader{backend=%q,key=%q}`, backend, key)
	if code, _ := get(t, addrA, "/leader"); code != 200 {
		t.Errorf("holder /leader = %d, want 200", code)
	}
	if code, _ := get(t, addrB, "/leader"); code != 503 {
		t.Errorf("waiter /leader = %d, want 503", code)
	}
	if _, body := get(t, addrA, "/metrics"); !strings.Contains(body, series+" 1") {
		t.Errorf("holder /metrics lacks %s 1", series)
	}
	if _, body := get(t, addrB, "/metrics"); !strings.Contains(body, series+" 0") {
		t.Errorf("waiter /metrics lacks %s 0", series)
	}
	for _, addr := range []string{addrA, addrB} {
		if code, body := get(t, addr, "/healthz"); code != 200 {
			t.Errorf("/healthz = %d %s", code, body)
		}
	}
	_, body := get(t, addrB, "/status")
	var st struct {
		State    string
		Position int
		Leader   struct{ Term uint64 }
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.State != "campaigning" || st.Position != 1 || st.Leader.Term == 0 {
		t.Errorf("waiter /status = %s (%v)", body, err)
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	if code := a.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("holder exited %d; stderr: %s", code, a.stderr)
	}
}
