// Package faultproxy is a TCP proxy on loopback that tests put between a
// client and its server to blackhole, delay or cut the link.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"
)

// Proxy forwards connections from its loopback address to a target. Its
// methods are safe for concurrent use.
type Proxy struct {
	addr   string
	target string

	mu         sync.Mutex
	ln         net.Listener // nil while refusing
	held       *held        // while refusing: the port, bound without listening
	dialFor    time.Duration
	blackholed bool
	delay      time.Duration
	conns      map[net.Conn]struct{}
	closed     bool
	wg         sync.WaitGroup
	accepted   int // client connections accepted
}

// New listens on a free loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.addr }

// Accepted returns how many client connections the proxy has accepted
// since New: a test can wait for a client to have connected.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// RetryDial makes the proxy try its target again, every 10 ms for up to
// d, when a connection to it is refused, before it closes the client's
// connection. The client has connected to the proxy by then: a server
// that opens its port a moment later (a ZooKeeper server that has just
// become the leader, which its followers connect to at once) is reached
// as if it had been listening, not dropped after an apparent success.
// Default 0: the client's connection is closed at the first refusal.
func (p *Proxy) RetryDial(d time.Duration) {
	p.mu.Lock()
	p.dialFor = max(d, 0)
	p.mu.Unlock()
}

// Refuse stops listening and closes every open connection: new
// connections are refused, as by a host whose server process is down
// (accepting them and closing them at once is not the same: a client
// then believes it connected, and may count what it sent as delivered).
// On Linux the port stays bound meanwhile, so that the kernel does not
// hand it out as another socket's ephemeral port.
// Listen ends it.
func (p *Proxy) Refuse() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	if ln != nil {
		ln.Close()
		if h, err := hold(p.addr); err == nil {
			p.held = h
		}
	}
	p.mu.Unlock()
	p.Cut()
}

// Listen ends Refuse: the proxy listens again on its address. Off Linux
// it fails if something else has taken the port meanwhile.
func (p *Proxy) Listen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil || p.closed {
		return nil
	}
	var ln net.Listener
	var err error
	if h := p.held; h != nil {
		p.held = nil
		ln, err = h.listen()
	} else {
		ln, err = net.Listen("tcp", p.addr)
	}
	if err != nil {
		return err
	}
	p.ln = ln
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

// Blackhole drops every byte in both directions, on open and new
// connections alike, without closing anything: requests hang, as when
// packets are lost. Bytes a Delay still holds are dropped too.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.blackholed = true
	p.mu.Unlock()
}

// Heal ends a blackhole. Connections that lost bytes are closed (their
// streams are corrupt); clients reconnect.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackholed {
		// Closed before the flag clears, in one step: no byte after a
		// dropped stretch reaches the other side on the same stream.
		p.cutLocked()
	}
	p.blackholed = false
}

// Delay holds every byte read from now on for d in each direction before
// forwarding it (a round trip gains 2·d), on open and new connections
// alike; order is kept. Delay(0) ends the delay for bytes read from then on
// (bytes already held still wait out their delay). A negative d counts as 0.
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(d, 0)
	p.mu.Unlock()
}

// Cut closes every open connection; new ones are accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutLocked()
}

func (p *Proxy) cutLocked() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy, closes its connections and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	ln := p.ln
	p.ln = nil
	if p.held != nil {
		p.held.close()
		p.held = nil
	}
	p.mu.Unlock()
	var err error
	if ln != nil {
		err = ln.Close()
	}
	p.Cut()
	p.wg.Wait()
	return err
}

// track counts c among the open connections, unless the proxy is closed
// or, for a connection accepted on ln (nil: one dialled to the target),
// ln no longer listens: Refuse closed it after Accept returned c.
func (p *Proxy) track(c net.Conn, ln net.Listener) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || ln != nil && p.ln != ln {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) dropping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blackholed
}

// state returns whether bytes read now are dropped, and how long the ones
// kept are held.
func (p *Proxy) state() (drop bool, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blackholed, p.delay
}

func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c, ln) {
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	var up net.Conn
	for up == nil {
		if p.dropping() { // a blackholed link does not even connect
			if _, err := c.Read(make([]byte, 4096)); err != nil {
				c.Close()
				return
			}
			continue
		}
		var err error
		if up, err = p.dial(); err != nil {
			c.Close()
			return
		}
	}
	if !p.track(up, nil) {
		c.Close()
		return
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.pump(up, c) }()
	p.pump(c, up)
}

// dial connects to the target, trying again while it refuses, for up to
// RetryDial's duration.
func (p *Proxy) dial() (net.Conn, error) {
	p.mu.Lock()
	until := time.Now().Add(p.dialFor)
	p.mu.Unlock()
	for {
		up, err := net.Dial("tcp", p.target)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(until) {
			return up, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// chunk is bytes read from one side, due on the other at due.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst, dropping bytes while blackholed and holding them
// while delayed, and closes both at the end. A second goroutine writes, so
// that reading goes on while delayed bytes wait.
func (p *Proxy) pump(dst, src net.Conn) {
	queue := make(chan chunk, 256)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		defer src.Close()
		defer dst.Close()
		failed := false
		for c := range queue {
			if failed {
				continue // drain, so that the reader never blocks for good
			}
			if w := time.Until(c.due); w > 0 {
				time.Sleep(w)
			}
			if p.dropping() {
				continue // blackholed while it was held
			}
			if _, err := dst.Write(c.b); err != nil {
				failed = true
				src.Close() // stops the reader
			}
		}
	}()
	defer close(queue)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if drop, delay := p.state(); !drop {
				queue <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(delay)}
			}
		}
		if err != nil {
			return
		}
	}
}
