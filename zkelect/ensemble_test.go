package zkelect_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/internal/zkserver"
	"github.com/tenure-go/tenure/zkelect"
)

// TestHerd_OneHandoffWakesOneWaiter: with 100 waiters queued, a handoff
// delivers exactly one watch event, to the next in line.
func TestHerd_OneHandoffWakesOneWaiter(t *testing.T) {
	const waiters = 100
	key := electiontest.Key(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	newElector := func(id string) (*election.Elector, *zkelect.Backend) {
		b := dial(t, server.Endpoints())
		t.Cleanup(b.Close)
		e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		return e, b
	}
	holder, _ := newElector("holder")
	if _, err := holder.Campaign(ctx); err != nil {
		t.Fatal(err)
	}
	type result struct {
		i  int
		at time.Time
	}
	elected := make(chan result, waiters)
	var backends []*zkelect.Backend
	var wg sync.WaitGroup
	for i := range waiters {
		e, b := newElector(fmt.Sprintf("w%d", i))
		backends = append(backends, b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.Campaign(ctx); err == nil {
				elected <- result{i, time.Now()}
			}
		}()
	}
	admin, _, err := zk.Connect(server.Endpoints(), ttl, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	waitUntil(t, "all waiters queued", func() bool {
		c, _, err := admin.Children(key)
		return err == nil && len(c) == waiters+1
	})
	// Waiters set their watches after queueing: let them settle.
	time.Sleep(300 * time.Millisecond)
	events := func() (n uint64) {
		for _, b := range backends {
			n += b.WatchEvents()
		}
		return n
	}
	before := events()
	resigned := time.Now()
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	first := <-elected
	time.Sleep(300 * time.Millisecond) // any herd would have woken by now
	woken := events() - before
	t.Logf("handoff to w%d took %v; watch events delivered to the 100 waiters: %d", first.i, first.at.Sub(resigned), woken)
	if woken != 1 {
		t.Fatalf("one handoff delivered %d watch events to the waiters, want exactly 1 (no herd)", woken)
	}
	select {
	case r := <-elected:
		t.Fatalf("w%d elected too, while w%d leads", r.i, first.i)
	default:
	}
	cancel()
	wg.Wait()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEnsemble_LeaderServerKilled: on a three-server ensemble, killing the
// ZooKeeper leader does not stop elections (the remaining quorum serves)
// and never yields two leaders.
func TestEnsemble_LeaderServerKilled(t *testing.T) {
	ens, err := zkserver.Start(t.TempDir(), zkserver.Options{Servers: 3, MaxSessionTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ens.Close()
	const sessionTimeout = 4 * time.Second
	key := electiontest.Key(t)
	var (
		active, overlaps atomic.Int32
		mu               sync.Mutex
		terms            []uint64
		killedAt         time.Time
		afterKill        int
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Each term's token, read off the create's reply (on whichever server
	// the candidate's connection uses, follower or leader), must be its
	// node's czxid.
	admin, _, err := zk.Connect(ens.Endpoints(), sessionTimeout, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var tokensChecked atomic.Int32
	var wg sync.WaitGroup
	var electors []*election.Elector
	var backends []*zkelect.Backend
	for i := range 3 {
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		b, err := zkelect.Dial(dctx, ens.Endpoints(), sessionTimeout)
		dcancel()
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		e, err := election.New(b, election.Config{Key: key, Identity: fmt.Sprint(i), TTL: sessionTimeout})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close(context.Background())
		electors, backends = append(electors, e), append(backends, b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := e.Run(ctx, tenure.Callbacks{OnElected: func(lctx context.Context, term tenure.Term) {
				if active.Add(1) > 1 {
					overlaps.Add(1)
				}
				mu.Lock()
				terms = append(terms, term.Token)
				if !killedAt.IsZero() {
					afterKill++
				}
				mu.Unlock()
				if _, st, err := admin.Get(term.Entry); err == nil {
					if uint64(st.Czxid) != term.Token {
						t.Errorf("term %s: token %d, but the node's czxid is %d", term.Entry, term.Token, st.Czxid)
					}
					tokensChecked.Add(1)
				}
				select {
				case <-lctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
				active.Add(-1)
			}})
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(terms) }
	waitUntil(t, "elections before the kill", func() bool { return count() >= 20 })
	leader, err := ens.Leader()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	killedAt = time.Now()
	mu.Unlock()
	if err := ens.Kill(leader); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := afterKill
		mu.Unlock()
		if n >= 20 {
			break
		}
		if time.Now().After(deadline) {
			// What each candidate and the servers hold, for the next one
			// to read: this has failed once, under make test's load.
			for i, e := range electors {
				sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
				st := e.Status(sctx)
				scancel()
				leader := "unread"
				if st.Leader != nil {
					leader = fmt.Sprintf("%+v", *st.Leader)
				}
				c := backends[i].Conn()
				t.Logf("candidate %d: %+v, leader %s; connection %v, session %#x, server %s", i, st, leader, c.State(), c.SessionID(), c.Server())
			}
			if raw, _, err := zk.Connect(ens.Endpoints(), sessionTimeout, zk.WithLogInfo(false)); err == nil {
				children, _, err := raw.Children(key)
				t.Logf("children of %s: %v (%v)", key, children, err)
				for _, c := range children {
					if _, st, err := raw.Get(key + "/" + c); err == nil {
						t.Logf("  %s: czxid %d, owner %#x", c, st.Czxid, st.EphemeralOwner)
					}
				}
				raw.Close()
			}
			t.Fatalf("timed out waiting for elections after the kill: %d of 20 (ZooKeeper leader server %d killed)", n, leader)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	servers := make([]string, len(backends))
	for i, b := range backends {
		servers[i] = b.Conn().Server()
	}
	t.Logf("killed ZooKeeper leader server %d; %d elections in all, %d after the kill; tokens checked against the czxid: %d; candidates on %v",
		leader, len(terms), afterKill, tokensChecked.Load(), servers)
	if tokensChecked.Load() < 20 {
		t.Fatalf("only %d tokens checked against their node", tokensChecked.Load())
	}
	if o := overlaps.Load(); o != 0 {
		t.Fatalf("%d elections overlapped another leader", o)
	}
	for i := 1; i < len(terms); i++ {
		if terms[i] <= terms[i-1] {
			t.Fatalf("term %d after %d: terms must grow", terms[i], terms[i-1])
		}
	}
}

// TestEnsemble_FollowerCutOffFromTheLeaderServer: a leader connected to a
// follower server that loses its links to the other servers (while the
// leader server keeps its quorum and counts the session down) demotes
// itself before the candidate on the quorum's side is elected. The
// follower answers its clients from its own copy for syncLimit × tickTime
// (1 s here) after the cut, so a confirmation it answers alone proves
// nothing about the session on the quorum's side. The first rounds cut at
// points of the renewal cycle; the last ones just after a renewal was
// answered, before the follower's next ping answer could tell the leader
// server of it (counted from that renewal's sync, the leader's work ran
// 103–213 ms into its successor's term in 4 of 4 such cuts).
func TestEnsemble_FollowerCutOffFromTheLeaderServer(t *testing.T) {
	ens, err := zkserver.Start(t.TempDir(), zkserver.Options{Servers: 3, Partitionable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ens.Close()
	const sessionTimeout = 2 * time.Second // ttl; the servers' maximum
	const phases, rounds = 3, 7            // rounds from phases on cut after a renewal
	for round := range rounds {
		leader, err := ens.Leader()
		if err != nil {
			t.Fatal(err)
		}
		follower, other := (leader+1)%3, (leader+2)%3
		key := electiontest.Key(t)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		var (
			mu                    sync.Mutex
			aStarted, aEnded, bAt time.Time
		)
		elected := make(chan string, 2)
		run := func(id string, endpoints []string, work func(context.Context)) (*election.Elector, *zkelect.Backend, func()) {
			dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
			b, err := zkelect.Dial(dctx, endpoints, sessionTimeout)
			dcancel()
			if err != nil {
				t.Fatal(err)
			}
			e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: sessionTimeout})
			if err != nil {
				t.Fatal(err)
			}
			rctx, rcancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = e.Run(rctx, tenure.Callbacks{OnElected: func(lctx context.Context, _ tenure.Term) {
					work(lctx) // records its start, then sends id on elected
				}})
			}()
			return e, b, func() {
				rcancel()
				<-done
				_ = e.Close(context.Background())
				b.Close()
			}
		}
		// a reaches only the follower; b only the other two servers.
		ea, ba, stopA := run("a", []string{ens.Endpoint(follower)}, func(lctx context.Context) {
			mu.Lock()
			first := aStarted.IsZero()
			if first {
				aStarted = time.Now()
			}
			mu.Unlock()
			elected <- "a"
			<-lctx.Done()
			if first {
				mu.Lock()
				aEnded = time.Now()
				mu.Unlock()
			}
		})
		if id := <-elected; id != "a" {
			t.Fatalf("round %d: %s elected first, want a", round, id)
		}
		if r := zkelect.ServerRole(ba); r != "ensemble" || !zkelect.StrictAnchor(ba) {
			t.Fatalf("round %d: a's connection reads role %s (strict %v), want ensemble", round, r, zkelect.StrictAnchor(ba))
		}
		if round == 0 {
			// On an ensemble a margin above 3/8 of the TTL leaves no room.
			_, err := ba.OpenSession(ctx, election.SessionOptions{TTL: sessionTimeout, RenewInterval: sessionTimeout / 4, DeadlineMargin: sessionTimeout / 2})
			if !errors.Is(err, tenure.ErrInvalidConfig) {
				t.Fatalf("OpenSession with DeadlineMargin TTL/2 on an ensemble: %v, want ErrInvalidConfig", err)
			}
		}
		_, _, stopB := run("b", []string{ens.Endpoint(leader), ens.Endpoint(other)}, func(lctx context.Context) {
			mu.Lock()
			if bAt.IsZero() {
				bAt = time.Now()
			}
			mu.Unlock()
			elected <- "b"
			<-lctx.Done()
		})
		admin, _, err := zk.Connect([]string{ens.Endpoint(leader)}, sessionTimeout, zk.WithLogInfo(false))
		if err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "b queued behind a", func() bool {
			c, _, err := admin.Children(key)
			return err == nil && len(c) == 2
		})
		admin.Close()
		if round < phases {
			// Cut at another point of a's renewal cycle (TTL/3) each round.
			time.Sleep(time.Duration(round) * sessionTimeout / 3 / phases)
		} else {
			// Cut as soon as a renewal was answered (a's deadline moved).
			d := ea.Deadline()
			for ea.Deadline().Equal(d) {
				time.Sleep(100 * time.Microsecond)
			}
		}
		cutAt := time.Now()
		if err := ens.Isolate(follower); err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-elected:
			if id != "b" {
				t.Fatalf("round %d: %s elected after the cut, want b", round, id)
			}
		case <-ctx.Done():
			t.Fatalf("round %d: b not elected after the follower was cut off", round)
		}
		mu.Lock()
		ended, bStarted := aEnded, bAt
		mu.Unlock()
		if ended.IsZero() {
			// b's work has started; give a's a moment to report, for the log.
			time.Sleep(2 * sessionTimeout)
			mu.Lock()
			ended = aEnded
			mu.Unlock()
			if ended.IsZero() {
				t.Fatalf("round %d: a still leads %v after the cut (b elected %v after it)", round, time.Since(cutAt), bStarted.Sub(cutAt))
			}
		}
		t.Logf("round %d (follower server %d cut off from leader server %d): a's work ended %v after the cut, b elected %v after it",
			round, follower, leader, ended.Sub(cutAt).Round(time.Millisecond), bStarted.Sub(cutAt).Round(time.Millisecond))
		if !ended.Before(bStarted) {
			t.Errorf("round %d: a's work ran until %v after b was elected", round, ended.Sub(bStarted))
		}
		stopB()
		stopA()
		cancel()
		if err := ens.Rejoin(follower); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the follower serving again", func() bool { return ens.Mode(follower) == "follower" })
	}
}
