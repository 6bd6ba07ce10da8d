package chaos

import (
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/tenure-go/tenure/internal/faultproxy"
)

// runConfig says what one run does.
type runConfig struct {
	be     backend
	srv    servers
	reg    *register
	sc     scenario
	id     string // unique within the test process
	lanes  int
	rounds int
	ttl    time.Duration
	every  time.Duration
	broken string
	logf   func(format string, args ...any)
}

// result is what one run found.
type result struct {
	scenario, backend string
	efficiencyOnly    bool
	faults            []faultRec
	refused           int // stale writes the register refused
	excused           int
	lateOK            int // writes of excused holders the register accepted after their successor began
	partitions        int // partitions made (one per round)
	partitionHits     int // partitions that cut off a server a leader's session was on
	violations        []violation
	harness           []string
}

func (res result) failovers() (n int, d []time.Duration) {
	for _, f := range res.faults {
		if !f.kept && f.failover > 0 {
			d = append(d, f.failover)
		}
	}
	return len(d), d
}

// doRun runs one scenario on one backend: it starts the candidates, injects
// the rounds of faults, stops the candidates and checks the invariants.
func doRun(c runConfig) (res result) {
	res.scenario, res.backend, res.efficiencyOnly = c.sc.name, c.be.name, !c.be.linearizable
	r := &run{id: c.id, be: c.be, srv: c.srv, reg: c.reg, sc: c.sc, rounds: c.rounds, ttl: c.ttl, every: c.every, broken: c.broken, start: mono(), logf: c.logf}
	defer func() {
		r.harnessM.Lock() // candidates' output readers may still report
		res.harness = append(res.harness, r.harness...)
		r.harnessM.Unlock()
		res.partitions, res.partitionHits = int(r.partitions.Load()), int(r.partitionHits.Load())
	}()
	// Set up before the proxies are: a proxy that fails to start must not
	// leave the ones made before it running.
	defer func() {
		for _, l := range r.lanes {
			for _, s := range l.slots {
				for _, px := range s.proxies {
					px.Close()
				}
			}
		}
	}()
	for i := range c.lanes {
		l := &lane{r: r, idx: i, key: fmt.Sprintf("/chaos/%s/l%d", c.id, i), byTok: map[procTok]*termInfo{}, open: map[string]*opRec{}, changed: make(chan struct{})}
		r.lanes = append(r.lanes, l)
		for j := range 3 {
			s := &slot{l: l, idx: j}
			l.slots = append(l.slots, s)
			for _, ep := range c.srv.Endpoints() {
				px, err := faultproxy.New(ep)
				if err != nil {
					r.fail("proxy: %v", err)
					return
				}
				s.proxies = append(s.proxies, px)
			}
		}
	}
	for _, l := range r.lanes {
		for _, s := range l.slots {
			if err := s.spawn(); err != nil {
				r.fail("spawn: %v", err)
				r.stopAll()
				return
			}
		}
	}
	for range c.rounds {
		res.violations = append(res.violations, r.round()...)
		if r.failed() {
			break
		}
	}
	// Let the last leader write once more, so that a successor's writes
	// follow every fault.
	for _, l := range r.lanes {
		if _, err := l.awaitWritingLeader(30 * time.Second); err != nil {
			res.violations = append(res.violations, violation{inv: livenessInvariant, what: err.Error()})
		}
	}
	stopping := mono()
	res.violations = append(res.violations, r.stopAll()...)
	end := mono()
	for _, l := range r.lanes {
		vs, excused, lateOK := l.check(end)
		vs = append(vs, l.checkGaps(stopping, end)...)
		res.violations = append(res.violations, vs...)
		res.excused += excused
		res.lateOK += lateOK
		_, refused := c.reg.history(l.key)
		res.refused += refused
		l.mu.Lock()
		res.faults = append(res.faults, l.faults...)
		l.mu.Unlock()
	}
	return res
}

// stopAll ends every candidate gracefully (healing its links and resuming
// it first) and checks invariant 4: no ZooKeeper candidate's session held a
// node once its elector had closed, and once they have exited, and the
// sessions of killed ones have expired, no entry is left.
func (r *run) stopAll() []violation {
	var vs []violation
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, l := range r.lanes {
		for _, s := range l.slots {
			for _, px := range s.proxies {
				px.Delay(0)
				px.Heal()
			}
			p := s.proc
			if p == nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				l.mu.Lock()
				frozen := p.frozen
				l.mu.Unlock()
				if frozen {
					_ = p.signal(syscall.SIGCONT)
				}
				_ = p.stdin.Close()
				select {
				case <-p.exited:
				case <-time.After(20 * time.Second):
					_ = p.signal(syscall.SIGKILL)
					<-p.exited
					mu.Lock()
					vs = append(vs, violation{inv: 4, what: fmt.Sprintf("%s did not exit within 20 s of being asked", p.id)})
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	// Nodes a candidate's own live session still held after its elector
	// closed: they would have stood in the queue for as long as the
	// process ran (the check below cannot see them: they went with the
	// process's session when it exited).
	for _, l := range r.lanes {
		l.mu.Lock()
		for _, left := range l.leftovers {
			vs = append(vs, violation{inv: 4, what: fmt.Sprintf("lane %d: %s", l.idx, left)})
		}
		l.mu.Unlock()
	}
	// Entries of killed candidates go when their sessions expire.
	limit := r.ttl + r.srv.ExpiryGranularity() + slack
	for _, l := range r.lanes {
		deadline := time.Now().Add(limit)
		for {
			n, err := r.srv.Entries(l.key)
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(deadline) {
				vs = append(vs, violation{inv: 4, what: fmt.Sprintf("lane %d: %d entries (err %v) left under %s %v after every candidate exited", l.idx, n, err, l.key, limit)})
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return vs
}
