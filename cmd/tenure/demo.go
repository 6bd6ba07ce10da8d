package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

const demoTTL = 2 * time.Second

// demoEvent is one thing a candidate reports.
type demoEvent struct {
	who    string
	what   string // "elected", "stopped", "demoted"
	term   tenure.Term
	reason error
	at     time.Time
}

// candidate is one in-process candidate with its own client behind its own
// fault proxy, as a separate process would have.
type candidate struct {
	name   string
	proxy  *faultproxy.Proxy
	cli    *clientv3.Client
	e      *election.Elector
	cancel context.CancelFunc
	done   chan error
	resign chan struct{} // closed to make the current OnElected return
	mu     sync.Mutex
	dead   bool
}

func cmdDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: tenure demo

Starts an embedded etcd in a temporary directory, runs three candidates for
one key (TTL 2s), then makes the leader resign, kills it (its connection
drops and its lease is left to expire) and cuts it off (its link is
blackholed), printing who leads, under which term, and how long each
failover took. Takes under 10 seconds and removes everything it made.
`)
	}
	rest, err := parse(fs, args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected arguments %q", rest)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tenure demo: %s\n", oneLine(err))
		return exitUsage
	}
	// A signal ends the demo through its own clean-up: the candidates
	// stop, the embedded etcd closes and its directory goes.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	ctx, caught, again, unwatch := cancelOnSignal(sigs)
	defer unwatch()
	// A second signal, while the first one's clean-up runs, exits at once.
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case s := <-again:
			fmt.Fprintf(stderr, "tenure demo: %v again: exiting without cleaning up\n", s)
			os.Exit(128 + int(s.(syscall.Signal)))
		case <-finished:
		}
	}()
	if err := demo(ctx, stdout); err != nil {
		if s := caught(); s != nil {
			fmt.Fprintf(stderr, "tenure demo: %v; stopped and cleaned up\n", s)
			return 128 + int(s.(syscall.Signal))
		}
		fmt.Fprintf(stderr, "tenure demo: %s\n", oneLine(err))
		return exitFailure
	}
	return exitOK
}

func demo(ctx context.Context, out io.Writer) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Fprintf(out, "%+8.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
	dir, err := os.MkdirTemp("", "tenure-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := etcdembed.Start(dir)
	if err != nil {
		return err
	}
	defer srv.Close()
	say("embedded etcd ready at %s (data in %s)", srv.Endpoint, dir)

	const key = "tenure-demo"
	events := make(chan demoEvent, 64)
	var cands []*candidate
	defer func() {
		for _, c := range cands {
			c.stop()
		}
	}()
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer admin.Close()
	for i := 1; i <= 3; i++ {
		c, err := startCandidate(fmt.Sprintf("c%d", i), key, srv.Endpoint, events)
		if err != nil {
			return err
		}
		cands = append(cands, c)
		// Each joins the queue before the next starts, so that the order
		// printed is the order of arrival.
		if err := queued(ctx, admin, key, i); err != nil {
			return err
		}
		say("%s campaigns for %q (TTL %v): %s in the queue", c.name, key, demoTTL, ordinal(i))
	}
	byName := map[string]*candidate{}
	for _, c := range cands {
		byName[c.name] = c
	}
	// next waits for the next election, reporting other events on the way.
	next := func() (demoEvent, error) {
		timeout := time.After(5 * demoTTL)
		for {
			select {
			case ev := <-events:
				c := byName[ev.who]
				if c.isDead() {
					continue // a killed process says nothing
				}
				switch ev.what {
				case "elected":
					return ev, nil
				case "stopped":
					say("%s stops its work (term %d): %v", ev.who, ev.term.Token, ev.reason)
				case "demoted":
					say("%s demoted (term %d): %v; it campaigns again, at the back of the queue", ev.who, ev.term.Token, ev.reason)
				}
			case <-timeout:
				return demoEvent{}, fmt.Errorf("no leader elected within %v", 5*demoTTL)
			case <-ctx.Done():
				return demoEvent{}, ctx.Err()
			}
		}
	}
	first, err := next()
	if err != nil {
		return err
	}
	say("%s elected, term %d", first.who, first.term.Token)
	type row struct {
		what     string
		from, to string
		took     time.Duration
		terms    [2]uint64
	}
	var summary []row

	// 1. Resign: the leader gives up; the next in line takes over.
	leader := byName[first.who]
	t0 := time.Now()
	say("%s resigns", leader.name)
	leader.resignNow()
	ev, err := next()
	if err != nil {
		return err
	}
	say("%s elected, term %d, %v after the resignation", ev.who, ev.term.Token, ev.at.Sub(t0).Round(time.Microsecond))
	summary = append(summary, row{"resign", leader.name, ev.who, ev.at.Sub(t0), [2]uint64{first.term.Token, ev.term.Token}})

	// 2. Kill: the leader's connection drops and its lease is not revoked.
	prev := ev
	leader = byName[ev.who]
	t0 = time.Now()
	say("%s is killed: its connection drops, its lease is left to expire (TTL %v)", leader.name, demoTTL)
	leader.kill()
	ev, err = next()
	if err != nil {
		return err
	}
	say("%s elected, term %d, %v after the kill", ev.who, ev.term.Token, ev.at.Sub(t0).Round(time.Millisecond))
	summary = append(summary, row{"kill", leader.name, ev.who, ev.at.Sub(t0), [2]uint64{prev.term.Token, ev.term.Token}})

	// 3. Cut off: the leader's link is blackholed; it must stop before the
	// server expires its lease and elects the next.
	prev = ev
	leader = byName[ev.who]
	t0 = time.Now()
	say("%s is cut off: its link to etcd is blackholed", leader.name)
	leader.proxy.Blackhole()
	var stoppedAt time.Time
	timeout := time.After(5 * demoTTL)
	for ev = (demoEvent{}); ev.what != "elected"; {
		select {
		case e := <-events:
			if byName[e.who].isDead() {
				continue
			}
			switch {
			case e.who == leader.name && e.what == "stopped":
				stoppedAt = e.at
				say("%s stops its own work (term %d), %v after the cut: %v", e.who, e.term.Token, e.at.Sub(t0).Round(time.Millisecond), e.reason)
			case e.what == "demoted":
				say("%s demoted (term %d): %v; it campaigns again, at the back of the queue", e.who, e.term.Token, e.reason)
			case e.what == "elected":
				ev = e
			}
		case <-timeout:
			return fmt.Errorf("no failover within %v of the cut", 5*demoTTL)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	say("%s elected, term %d, %v after the cut", ev.who, ev.term.Token, ev.at.Sub(t0).Round(time.Millisecond))
	if stoppedAt.IsZero() || !stoppedAt.Before(ev.at) {
		return fmt.Errorf("the cut-off leader %s had not stopped when %s was elected", leader.name, ev.who)
	}
	say("%s had stopped %v before %s was elected: no overlap", leader.name, ev.at.Sub(stoppedAt).Round(time.Millisecond), ev.who)
	summary = append(summary, row{"cut off", leader.name, ev.who, ev.at.Sub(t0), [2]uint64{prev.term.Token, ev.term.Token}})
	leader.proxy.Heal()
	say("%s's link is healed", leader.name)

	fmt.Fprintf(out, "\nfailover   from  to    terms         took\n")
	last := uint64(0)
	for _, r := range summary {
		fmt.Fprintf(out, "%-10s %-5s %-5s %5d → %-5d %v\n", r.what, r.from, r.to, r.terms[0], r.terms[1], r.took.Round(time.Microsecond))
		if r.terms[0] < last || r.terms[1] <= r.terms[0] {
			return fmt.Errorf("%s: term %d → %d after %d: terms must only grow", r.what, r.terms[0], r.terms[1], last)
		}
		last = r.terms[1]
	}
	fmt.Fprintf(out, "\nterms only grew; every failover but the resignation waited for the TTL (%v) to run out on the server.\n", demoTTL)
	fmt.Fprintf(out, "A term is the etcd revision that created the leader's key: it skips the revisions of other writes (a resignation's delete, a new campaign's key).\n")
	return nil
}

// queued waits until n candidates' keys are under key's prefix.
func queued(ctx context.Context, admin *clientv3.Client, key string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		r, err := admin.Get(ctx, key+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && r.Count >= int64(n) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("candidate %d not queued within 5s: %w", n, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func ordinal(i int) string { return [...]string{"first", "second", "third"}[i-1] }

func startCandidate(name, key, endpoint string, events chan<- demoEvent) (*candidate, error) {
	p, err := faultproxy.New(endpoint)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Addr()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		p.Close()
		return nil, err
	}
	e, err := election.New(etcdelect.New(cli), election.Config{Key: key, Identity: name, TTL: demoTTL})
	if err != nil {
		cli.Close()
		p.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{name: name, proxy: p, cli: cli, e: e, cancel: cancel, done: make(chan error, 1), resign: make(chan struct{})}
	go func() {
		c.done <- e.Run(ctx, tenure.Callbacks{
			OnElected: func(lctx context.Context, term tenure.Term) {
				// The channel that resignNow closes after this event is
				// received: read before the event is sent, or a resignation
				// made at once could close one and leave this term waiting
				// on the next.
				c.mu.Lock()
				resign := c.resign
				c.mu.Unlock()
				events <- demoEvent{who: name, what: "elected", term: term, at: time.Now()}
				select {
				case <-lctx.Done():
					events <- demoEvent{who: name, what: "stopped", term: term, reason: context.Cause(lctx), at: time.Now()}
				case <-resign:
				}
			},
			OnDemoted: func(term tenure.Term, reason error) {
				events <- demoEvent{who: name, what: "demoted", term: term, reason: reason, at: time.Now()}
			},
		})
	}()
	return c, nil
}

func (c *candidate) resignNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.resign)
	c.resign = make(chan struct{})
}

func (c *candidate) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// kill makes the candidate behave as a killed process: its connection is
// gone, nothing is released, and it says nothing more.
func (c *candidate) kill() {
	c.mu.Lock()
	c.dead = true
	c.mu.Unlock()
	c.cli.Close()
}

func (c *candidate) stop() {
	c.cancel()
	<-c.done
	ctx, cancel := context.WithTimeout(context.Background(), demoTTL)
	defer cancel()
	_ = c.e.Close(ctx)
	c.cli.Close()
	c.proxy.Close()
}
