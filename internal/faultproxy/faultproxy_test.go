package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves one echo server on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if got != msg+"\n" {
		t.Fatalf("echo %q, want %q", got, msg)
	}
	return time.Since(start)
}

// TestDelay_HoldsEachDirectionAndKeepsOrder: with Delay(d) a round trip
// takes at least 2·d, bytes arrive in order, and Delay(0) restores the
// link.
func TestDelay_HoldsEachDirectionAndKeepsOrder(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	// The undelayed round trips must be well below a delayed one (2·d),
	// with room for a loaded machine: under d.
	const d = 500 * time.Millisecond
	if rtt := roundTrip(t, c, r, "warm"); rtt > d {
		t.Fatalf("undelayed round trip took %v", rtt)
	}
	p.Delay(d)
	// Several messages in flight at once come back in order.
	start := time.Now()
	for _, m := range []string{"a", "b", "c"} {
		if _, err := io.WriteString(c, m+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []string{"a", "b", "c"} {
		got, err := r.ReadString('\n')
		if err != nil || got != m+"\n" {
			t.Fatalf("read %q, %v; want %q", got, err, m)
		}
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Fatalf("delayed round trip took %v, want at least %v", rtt, 2*d)
	}
	p.Delay(0)
	if rtt := roundTrip(t, c, r, "fast"); rtt > d {
		t.Fatalf("round trip after Delay(0) took %v", rtt)
	}
}

// TestBlackholeHeal_DropsThenCutsTheConnection: a blackholed link loses
// the bytes sent through it; Heal closes the connection, and a new one
// works.
func TestBlackholeHeal_DropsThenCutsTheConnection(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip(t, c, r, "x")
	p.Blackhole()
	if _, err := io.WriteString(c, "lost\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read %q through a blackhole", got)
	}
	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the healed connection still delivers; want it closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the healed connection stays open; want it closed")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	roundTrip(t, c2, bufio.NewReader(c2), "y")
}

// TestRefuseListen: a refusing proxy refuses connections (as a host whose
// server is down) and has closed the open ones; Listen serves again on the
// same address, twice.
func TestRefuseListen(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	open, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	roundTrip(t, open, bufio.NewReader(open), "before")
	p.Refuse()
	if _, err := net.Dial("tcp", p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while refusing: %v, want connection refused", err)
	}

	open.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := open.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a connection opened before Refuse: %v, want it closed", err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if i > 0 {
			p.Refuse()
			if err := p.Listen(); err != nil {
				t.Fatal(err)
			}
		}
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatalf("dial after Listen: %v", err)
		}
		roundTrip(t, c, bufio.NewReader(c), "after")
		c.Close()
	}
}

// TestRetryDial_ReachesATargetThatListensLate: with RetryDial, a client
// that connects while the target is not yet listening is forwarded to it
// once it listens; without, its connection is closed.
func TestRetryDial_ReachesATargetThatListensLate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	target := ln.Addr().String()
	ln.Close() // nothing listens there for now
	for _, retry := range []bool{false, true} {
		p, err := New(target)
		if err != nil {
			t.Fatal(err)
		}
		if retry {
			p.RetryDial(2 * time.Second)
		}
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if !retry {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("without RetryDial, read from a proxy whose target refuses: %v, want the connection closed", err)
			}
			c.Close()
			p.Close()
			continue
		}
		time.Sleep(200 * time.Millisecond)
		late, err := net.Listen("tcp", target)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			s, err := late.Accept()
			if err != nil {
				return
			}
			defer s.Close()
			_, _ = io.Copy(s, s)
		}()
		roundTrip(t, c, bufio.NewReader(c), "late")
		c.Close()
		p.Close()
		late.Close()
		<-done
	}
}

// TestBlackhole_DropsWhatADelayStillHolds: bytes read while delayed and
// still held when the link is blackholed are dropped, as the blackhole
// says; they used to reach the server when their delay ran out.
func TestBlackhole_DropsWhatADelayStillHolds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 16)
	srvDone := make(chan struct{})
	go func() {
		defer close(srvDone)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			got <- l
		}
	}()
	p, err := New(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "warm\n"); err != nil {
		t.Fatal(err)
	}
	if l := <-got; l != "warm\n" {
		t.Fatalf("server read %q", l)
	}
	p.Delay(time.Second)
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // read by the proxy, held
	p.Blackhole()
	select {
	case l := <-got:
		t.Errorf("the server read %q through a blackhole: held bytes went through", l)
	case <-time.After(2 * time.Second): // past the delay
	}
	c.Close()
	p.Close()
	<-srvDone
}
