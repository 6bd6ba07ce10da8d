package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/redislock"
)

// memberOf finds the waiting entry of ticket name (its random part) in
// "<key>:waiting" on c: "<session> <random>", or "" when absent.
func memberOf(ctx context.Context, c *redis.Client, key, name string) string {
	ms, _ := c.ZRange(ctx, key+":waiting", 0, -1).Result()
	for _, m := range ms {
		if strings.HasSuffix(m, " "+name) {
			return m
		}
	}
	return ""
}

// subscribers counts the clients subscribed to the session channel of a
// waiting entry ("<session> <random>") for key.
func subscribers(ctx context.Context, c *redis.Client, key, member string) int64 {
	session, _, _ := strings.Cut(member, " ")
	ch := "tenure:" + key + ":" + session
	n, err := c.PubSubNumSub(ctx, ch).Result()
	if err != nil {
		return -1
	}
	return n[ch]
}

// TestRelease_SkipsAWaiterWhoseProcessDied: a release wakes one waiter,
// the one the server heard from least recently. One whose process died
// is that one until its entry ages out (a TTL), and its wake-up reached
// nobody, so every handoff in that window waited for the held key's
// expiry. Its session channel has no subscriber any more: the release
// drops it and wakes the next.
func TestRelease_SkipsAWaiterWhoseProcessDied(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	admin := client(t, srv.Addr())
	opts := election.SessionOptions{TTL: 6 * time.Second, RenewInterval: 2 * time.Second}
	enqueue := func(s election.Session, id string) election.Ticket {
		tk, err := s.Enqueue(ctx, key, id)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// registered waits until tk waits on the server and listens on its
	// channel, and returns its waiting entry.
	registered := func(tk election.Ticket) string {
		var m string
		electiontest.WaitFor(t, 10*time.Second, tk.Identity+" registered and subscribed", func() bool {
			m = memberOf(ctx, admin, key, tk.Name)
			return m != "" && subscribers(ctx, admin, key, m) == 1
		})
		return m
	}

	sh := openSession(t, ctx, h.newBackend(t), opts)
	th := enqueue(sh, "holder")
	if _, err := sh.WaitHead(ctx, th); err != nil {
		t.Fatal(err)
	}

	// The dead waiter registers first: the server heard from it least
	// recently. Then its process "dies": its connections close.
	bd := h.newBackend(t)
	sd := openSession(t, ctx, bd, opts)
	td := enqueue(sd, "dead")
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	ddone := make(chan struct{})
	go func() { defer close(ddone); _, _ = sd.WaitHead(dctx, td) }()
	dm := registered(td)
	h.proxies[bd].Blackhole()
	h.proxies[bd].Cut()
	electiontest.WaitFor(t, 5*time.Second, "the dead waiter's subscription gone", func() bool {
		return subscribers(ctx, admin, key, dm) == 0
	})

	type won struct {
		i   int
		err error
	}
	wins := make(chan won, 2)
	var live []election.Session
	var tickets []election.Ticket
	for i := range 2 {
		s := openSession(t, ctx, h.newBackend(t), opts)
		tk := enqueue(s, fmt.Sprintf("live%d", i))
		go func() { _, err := s.WaitHead(ctx, tk); wins <- won{i, err} }()
		registered(tk)
		live, tickets = append(live, s), append(tickets, tk)
	}
	score, err := admin.ZScore(ctx, key+":waiting", dm).Result()
	if err != nil {
		t.Fatalf("the dead waiter's entry is gone before any release: %v", err)
	}
	if first, _ := admin.ZRangeWithScores(ctx, key+":waiting", 0, 0).Result(); len(first) != 1 || first[0].Score != score {
		t.Fatalf("the dead waiter is not the one heard from least recently: %v, its score %v", first, score)
	}

	// Two handoffs: holder to a live waiter, then to the other. Each must
	// be quick, far below the 6 s the held key had left.
	release := func(s election.Session, tk election.Ticket) int {
		start := time.Now()
		if err := s.Dequeue(ctx, tk); err != nil {
			t.Fatal(err)
		}
		select {
		case <-time.After(2 * time.Second):
			t.Fatalf("no waiter holds 2 s after %s released (TTL 6 s): the release woke the dead waiter", tk.Identity)
		case w := <-wins:
			if w.err != nil {
				t.Fatal(w.err)
			}
			t.Logf("%s holds %v after %s released", tickets[w.i].Identity, time.Since(start), tk.Identity)
			return w.i
		}
		return -1
	}
	i := release(sh, th)
	if m := memberOf(ctx, admin, key, td.Name); m != "" {
		t.Errorf("the dead waiter's entry %q is still registered after a release", m)
	}
	release(live[i], tickets[i])
	dcancel()
	<-ddone
}

// scriptCalls counts the scripts the server has run (EVAL and EVALSHA).
func scriptCalls(t *testing.T, ctx context.Context, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			var n int64
			fmt.Sscanf(strings.SplitN(strings.TrimPrefix(strings.SplitN(line, ":", 2)[1], "calls="), ",", 2)[0], "%d", &n)
			total += n
		}
	}
	return total
}

// TestLateTryAfterCleanUpTakesNothing: a try whose reply is lost may
// still be on its way when its campaign gives up, and the clean-up, on
// another connection, can reach the server first. The late try must then
// neither take a free key (a holder nobody extends, that observers would
// see for a TTL) nor, behind a holder, register as a waiter (one that
// absorbs the holder's release).
func TestLateTryAfterCleanUpTakesNothing(t *testing.T) {
	for _, held := range []bool{false, true} {
		name := "free"
		if held {
			name = "held"
		}
		t.Run(name, func(t *testing.T) { testLateTry(t, held) })
	}
}

func testLateTry(t *testing.T, held bool) {
	ctx := ctxT(t, 30*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	admin := client(t, srv.Addr())
	opts := election.SessionOptions{TTL: 5 * time.Second, RenewInterval: time.Second}
	b := h.newBackend(t) // its client reads for 300 ms at most
	s := openSession(t, ctx, b, opts)
	campaign := func(s election.Session, key string) election.Ticket {
		tk, err := s.Enqueue(ctx, key, "c")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitHead(ctx, tk); err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// A first campaign loads the scripts: a late EVALSHA of a script the
	// server does not know would fail (NOSCRIPT) and show nothing.
	if err := s.Dequeue(ctx, campaign(s, key+"-warm")); err != nil {
		t.Fatal(err)
	}
	var holder string
	if held {
		campaign(openSession(t, ctx, h.newBackend(t), opts), key)
		holder = admin.Get(ctx, key).Val()
	}
	tk, err := s.Enqueue(ctx, key, "late")
	if err != nil {
		t.Fatal(err)
	}
	p := h.proxies[b]
	p.Delay(time.Second) // the try reaches the server a second after it is sent
	sent := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = s.WaitHead(wctx, tk)
	wcancel()
	if err == nil {
		t.Fatal("WaitHead took the key through a link that holds every byte for 1 s")
	}
	p.Delay(0) // the clean-up goes straight through
	before := scriptCalls(t, ctx, admin)
	if err := s.Dequeue(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if time.Since(sent) > 800*time.Millisecond {
		t.Fatalf("the clean-up finished %v after the try: it did not overtake it", time.Since(sent))
	}
	// The try lands about 1 s after it was sent. (In the held case the
	// holder's watchdog runs scripts too: the count alone does not show
	// that the late try ran.)
	electiontest.WaitFor(t, 5*time.Second, "the late try run by the server", func() bool {
		return scriptCalls(t, ctx, admin) >= before+2 && time.Since(sent) > 1200*time.Millisecond // the clean-up and the late try
	})
	time.Sleep(50 * time.Millisecond)
	if v := admin.Get(ctx, key).Val(); v != holder {
		t.Errorf("the key after a late try = %q, want %q: the try landed after its clean-up and took it", v, holder)
	}
	if m := memberOf(ctx, admin, key, tk.Name); m != "" {
		t.Errorf("the late try registered %q as waiting after its clean-up", m)
	}
}

// TestRedlock_MinorityTryKeepsItsWaitingEntries: when a master lacks the
// holder's key (a restart lost it), a waiter's try takes that one master
// and is registered as waiting on the others. Redlock undoes the minority;
// the undo must keep the registrations, or the holder's release wakes
// nobody and the waiter starts only on its watchdog's next round.
func TestRedlock_MinorityTryKeepsItsWaitingEntries(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	_, clients := startMasters(t, 3)
	key := electiontest.Key(t)
	// TTL 9 s: the watchdog's round, every 3 s, would find a waiter that
	// lost its registrations; the handoff below must not wait for it.
	opts := election.SessionOptions{TTL: 9 * time.Second, RenewInterval: 3 * time.Second}
	session := func() election.Session {
		b, err := redislock.New(clients, redislock.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return openSession(t, ctx, b, opts)
	}
	sh, sw := session(), session()
	for round := range 2 {
		th, err := sh.Enqueue(ctx, key, "holder")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sh.WaitHead(ctx, th); err != nil {
			t.Fatal(err)
		}
		// WaitHead returns once two masters granted. Were the third's
		// grant still on its way when master 0 loses the key, the
		// waiter's try would take master 0 and that third one, a quorum
		// (a fresh-clone CI run: registered nowhere, it "held" 135 µs
		// after the release).
		electiontest.WaitFor(t, 5*time.Second, "the holder's key on every master", func() bool {
			for _, c := range clients {
				if c.Exists(ctx, key).Val() != 1 {
					return false
				}
			}
			return true
		})
		if err := clients[0].Del(ctx, key).Err(); err != nil { // master 0 lost it
			t.Fatal(err)
		}
		tw, err := sw.Enqueue(ctx, key, "waiter")
		if err != nil {
			t.Fatal(err)
		}
		before := scriptCalls(t, ctx, clients[0])
		done := make(chan error, 1)
		go func() { _, err := sw.WaitHead(ctx, tw); done <- err }()
		// The waiter has tried, taken master 0, and been undone there:
		// two tries (before and after subscribing) and two undos, in a few
		// milliseconds (the watchdogs' scripts, every 3 s, add to the
		// count, so the pause below covers the undos).
		electiontest.WaitFor(t, 10*time.Second, "the waiter's tries on master 0", func() bool {
			return scriptCalls(t, ctx, clients[0]) >= before+4
		})
		time.Sleep(100 * time.Millisecond)
		for i := 1; i < 3; i++ {
			if m := memberOf(ctx, clients[i], key, tw.Name); m == "" {
				t.Errorf("round %d: the waiter is not registered on master %d after its minority try was undone", round, i)
			}
		}
		start := time.Now()
		if err := sh.Dequeue(ctx, th); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d: the waiter holds %v after the release", round, time.Since(start))
		case <-time.After(time.Second):
			t.Fatalf("round %d: the waiter does not hold 1 s after the release: the release woke nobody", round)
		}
		if err := sw.Dequeue(ctx, tw); err != nil {
			t.Fatal(err)
		}
		// A release returns once a quorum of masters has answered; the
		// next round needs the key gone from all three, or its holder may
		// take only two (a fresh-clone CI run: the waiter then held on
		// master 0 and the third master, before the release).
		electiontest.WaitFor(t, 10*time.Second, "the key released on every master", func() bool {
			for _, c := range clients {
				if c.Exists(ctx, key).Val() != 0 {
					return false
				}
			}
			return true
		})
	}
}

// TestRelease_StalledWaiterAbsorbsOneWakeUp: a waiter that hears its
// wake-up but cannot act on it (its process stalled) is taken out of the
// waiting set by the release that wakes it. Left in, it stayed the one
// heard from least recently until its entry aged out, and every release
// in that window woke it and nobody else.
func TestRelease_StalledWaiterAbsorbsOneWakeUp(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	admin := client(t, srv.Addr())
	opts := election.SessionOptions{TTL: 10 * time.Second, RenewInterval: 3 * time.Second}

	// The stalled waiter: subscribed to its session channel, registered
	// as heard from 5 s before a live waiter's TTL would end (so it is
	// the one heard from least recently, and stays registered for 5 s).
	const stalledSession, stalledRandom = "0123456789abcdef", "00112233445566778899aabbccddeeff"
	stalled := stalledSession + " " + stalledRandom
	sub := client(t, srv.Addr()).Subscribe(ctx, "tenure:"+key+":"+stalledSession)
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, key+":waiting", redis.Z{Score: float64(now.Add(5 * time.Second).UnixMilli()), Member: stalled}).Err(); err != nil {
		t.Fatal(err)
	}
	heard := make(chan string, 4)
	go func() {
		for m := range sub.Channel() {
			heard <- m.Payload
		}
	}()

	campaign := func(id string) (election.Session, election.Ticket) {
		s := openSession(t, ctx, h.newBackend(t), opts)
		tk, err := s.Enqueue(ctx, key, id)
		if err != nil {
			t.Fatal(err)
		}
		return s, tk
	}
	holder, th := campaign("holder")
	if _, err := holder.WaitHead(ctx, th); err != nil {
		t.Fatal(err)
	}
	live, tl := campaign("live")
	won := make(chan error, 1)
	go func() { _, err := live.WaitHead(ctx, tl); won <- err }()
	electiontest.WaitFor(t, 10*time.Second, "the live waiter registered and subscribed", func() bool {
		m := memberOf(ctx, admin, key, tl.Name)
		return m != "" && subscribers(ctx, admin, key, m) == 1
	})

	// The first release wakes the stalled waiter, which does nothing.
	if err := holder.Dequeue(ctx, th); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-heard:
		if p != stalledRandom {
			t.Fatalf("the stalled waiter heard %q, want its random part", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first release did not wake the waiter heard from least recently")
	}
	if _, err := admin.ZScore(ctx, key+":waiting", stalled).Result(); err != redis.Nil {
		t.Errorf("the woken stalled waiter is still registered (%v)", err)
	}
	// Someone takes the free key before the live waiter's timer fires,
	// and releases it: this time the live waiter must be woken.
	next, tn := campaign("next")
	if _, err := next.WaitHead(ctx, tn); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := next.Dequeue(ctx, tn); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-won:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the live waiter holds %v after the second release", time.Since(start))
	case p := <-heard:
		t.Fatalf("the second release woke the stalled waiter again (%q), not the live one", p)
	case <-time.After(2 * time.Second):
		t.Fatal("the live waiter does not hold 2 s after the second release (TTL 10 s)")
	}
}

// TestWaiting_ShortTTLCandidateKeepsLongerWaiters: a key's waiting set
// holds waiters of different TTLs. A candidate with a short TTL that
// registers must not shorten the set's expiry below what the longer
// waiters need: when it expired, their registrations went with it, and a
// release woke nobody (they tried again at their next renewal, a second
// later). Before, the set's PTTL fell to 2 × the short TTL.
func TestWaiting_ShortTTLCandidateKeepsLongerWaiters(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	h := newTestHarness()
	key := electiontest.Key(t)
	admin := client(t, srv.Addr())
	long := election.SessionOptions{TTL: 6 * time.Second, RenewInterval: 2 * time.Second}
	short := election.SessionOptions{TTL: time.Second, RenewInterval: 300 * time.Millisecond}
	sh := openSession(t, ctx, h.newBackend(t), long)
	th, err := sh.Enqueue(ctx, key, "holder")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sh.WaitHead(ctx, th); err != nil {
		t.Fatal(err)
	}
	sl := openSession(t, ctx, h.newBackend(t), long)
	tl, err := sl.Enqueue(ctx, key, "long")
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(ctx)
	ldone := make(chan struct{})
	go func() { defer close(ldone); _, _ = sl.WaitHead(lctx, tl) }()
	defer func() { lcancel(); <-ldone }()
	electiontest.WaitFor(t, 10*time.Second, "the long waiter registered", func() bool { return memberOf(ctx, admin, key, tl.Name) != "" })

	ss := openSession(t, ctx, h.newBackend(t), short)
	ts, err := ss.Enqueue(ctx, key, "short")
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 700*time.Millisecond)
	_, err = ss.WaitHead(sctx, ts) // registers, renews a few times, gives up
	scancel()
	if err == nil {
		t.Fatal("the short candidate took a held key")
	}
	pttl, err := admin.PTTL(ctx, key+":waiting").Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("waiting set's PTTL after a 1 s candidate came and went: %v (the long waiter needs 2 × 6 s)", pttl)
	if pttl < 2*short.TTL+time.Second {
		t.Errorf("waiting set's PTTL = %v: the short candidate cut it to its own 2 × TTL; the long waiter's entry would go with it", pttl)
	}
	if memberOf(ctx, admin, key, tl.Name) == "" {
		t.Error("the long waiter's entry is gone")
	}
}

// TestRedlock_TokensGrowWhenAMasterCountedAhead: each master counts its
// own tokens, and tries that took a minority and were undone leave some
// counters ahead of others. A holder whose quorum includes such a master
// draws its larger count; the next holder, on a quorum without it, must
// still draw more. Before, it drew less (101, then 2): nothing was lost,
// no master failed over, and the terms went backwards.
func TestRedlock_TokensGrowWhenAMasterCountedAhead(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, admins := startMasters(t, 3)
	key := electiontest.Key(t)
	if err := admins[2].Set(ctx, key+":fence", 100, 0).Err(); err != nil {
		t.Fatal(err)
	}
	opts := election.SessionOptions{TTL: 2 * time.Second, RenewInterval: 600 * time.Millisecond}
	// w's first master answers late: w's quorum is the other two, the
	// one that counted ahead included.
	slow, err := faultproxy.New(servers[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	slow.Delay(100 * time.Millisecond)
	wcs := []*redis.Client{client(t, slow.Addr()), client(t, servers[1].Addr()), client(t, servers[2].Addr())}
	bw, err := redislock.New(wcs, redislock.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sw := openSession(t, ctx, bw, opts)
	tw, err := sw.Enqueue(ctx, key, "w")
	if err != nil {
		t.Fatal(err)
	}
	if tw, err = sw.WaitHead(ctx, tw); err != nil {
		t.Fatal(err)
	}
	if tw.Token <= 100 {
		t.Fatalf("w's token is %d: its quorum missed the master that counted ahead, the test shows nothing", tw.Token)
	}
	var counters []int64
	for _, a := range admins {
		n, err := a.Get(ctx, key+":fence").Int64()
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		counters = append(counters, n)
	}
	if err := sw.Dequeue(ctx, tw); err != nil {
		t.Fatal(err)
	}
	// x reaches the two masters that counted behind.
	var xcs []*redis.Client
	for i, s := range servers {
		p, err := faultproxy.New(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if i == 2 {
			p.Blackhole()
		}
		xcs = append(xcs, client(t, p.Addr()))
	}
	bx, err := redislock.New(xcs, redislock.Options{MasterTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sx := openSession(t, ctx, bx, opts)
	tx, err := sx.Enqueue(ctx, key, "x")
	if err != nil {
		t.Fatal(err)
	}
	if tx, err = sx.WaitHead(ctx, tx); err != nil {
		t.Fatal(err)
	}
	t.Logf("w's token %d (counters then: %v); x's, on the first two masters, %d", tw.Token, counters, tx.Token)
	if tx.Token <= tw.Token {
		t.Errorf("x's term %d follows w's %d: tokens went backwards", tx.Token, tw.Token)
	}
	_ = sx.Dequeue(ctx, tx)
}
