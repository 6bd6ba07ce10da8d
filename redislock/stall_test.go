package redislock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/redislock"
)

// stalledMaster is a TCP server that speaks just enough RESP to be dialled
// as a Redis master, refuses every command with an error, and never
// answers SUBSCRIBE: a master that stalls in the middle of a
// subscription, as one does when it is paused right after accepting it.
type stalledMaster struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newStalledMaster(t *testing.T) *stalledMaster {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &stalledMaster{ln: ln}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			m.mu.Lock()
			m.conns = append(m.conns, c)
			m.mu.Unlock()
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				m.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		m.mu.Lock()
		for _, c := range m.conns {
			c.Close()
		}
		m.mu.Unlock()
		m.wg.Wait()
	})
	return m
}

func (m *stalledMaster) addr() string { return m.ln.Addr().String() }

// serve reads commands (RESP arrays of bulk strings) until the connection
// ends. HELLO gets an error, so go-redis stays on RESP2; SUBSCRIBE gets
// nothing; everything else gets an error reply.
func (m *stalledMaster) serve(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "*")))
		if err != nil || !strings.HasPrefix(line, "*") {
			return
		}
		var args []string
		for range n {
			if _, err := r.ReadString('\n'); err != nil { // $len
				return
			}
			arg, err := r.ReadString('\n')
			if err != nil {
				return
			}
			args = append(args, strings.TrimSpace(arg))
		}
		if len(args) > 0 && strings.EqualFold(args[0], "SUBSCRIBE") {
			continue
		}
		if _, err := fmt.Fprintf(c, "-ERR stalled master\r\n"); err != nil {
			return
		}
	}
}

// TestRedlock_MasterStalledMidSubscribe: a Redlock waiter subscribes on
// every master; one that never answers the SUBSCRIBE must neither hold the
// waiter past the client's read timeout (two of three masters are a
// quorum, so it leads when the holder resigns) nor keep it from returning
// at once when its ctx ends. go-redis's Receive watches neither ctx nor,
// by default, the clock.
func TestRedlock_MasterStalledMidSubscribe(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	stalled := newStalledMaster(t)
	_, clients := startMasters(t, 2)
	// The stalled master's client reads for up to 2 s: a waiter held by it
	// for good (before the fix) would never lead below.
	sc := redis.NewClient(&redis.Options{Addr: stalled.addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: time.Second, MaintNotificationsConfig: noMaint()})
	t.Cleanup(func() { sc.Close() })
	clients = append(clients, sc)
	key := electiontest.Key(t)
	newElector := func(id string) *election.Elector {
		b, err := redislock.New(clients, redislock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
	holder, waiter, quitter := newElector("holder"), newElector("waiter"), newElector("quitter")
	if _, err := holder.Campaign(ctx); err != nil {
		t.Fatalf("holder with 2 of 3 masters: %v", err)
	}

	// The quitter gives up while its subscription hangs on the stalled
	// master: its campaign must end with its ctx.
	qctx, qcancel := context.WithCancel(ctx)
	qdone := make(chan error, 1)
	go func() {
		_, err := quitter.Campaign(qctx)
		qdone <- err
	}()
	registered := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for clients[0].ZCard(ctx, key+":waiting").Val() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d waiter(s) not registered within 10 s", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond) // registered, then subscribing
	}
	registered(1)
	qcancel()
	select {
	case err := <-qdone:
		if !errors.Is(err, tenure.ErrCanceled) {
			t.Fatalf("quitter's Campaign = %v, want ErrCanceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("quitter's Campaign did not return within 10 s of its ctx ending")
	}

	wdone := make(chan error, 1)
	go func() {
		_, err := waiter.Campaign(ctx)
		wdone <- err
	}()
	registered(1) // the quitter's registration went with its campaign
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-wdone:
		if err != nil {
			t.Fatalf("waiter's Campaign = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("waiter not elected within 20 s of the release: held by the stalled master")
	}
	if !waiter.IsLeader() {
		t.Fatal("waiter's Campaign returned without leading")
	}
}
