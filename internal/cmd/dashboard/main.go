// Command dashboard runs three candidates on an embedded etcd through a
// resignation, a kill and a cut-off, samples each one's metrics every
// 100 ms as Prometheus would scrape them, and draws the dashboard's main
// panels from that data as an SVG:
//
//	go run ./internal/cmd/dashboard -out docs/img/dashboard.svg
package main

import (
	"context"
	"flag"
	"fmt"
	"html"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/faultproxy"
)

const ttl = 2 * time.Second

type candidate struct {
	name   string
	proxy  *faultproxy.Proxy
	cli    *clientv3.Client
	e      *election.Elector
	reg    *prometheus.Registry
	resign chan struct{}
	mu     sync.Mutex
	dead   bool
}

type sample struct {
	at                                 float64
	leader, term, remaining, suspended float64
}

type event struct {
	at   float64
	what string
}

func main() {
	out := flag.String("out", "docs/img/dashboard.svg", "SVG file to write")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	dir, err := os.MkdirTemp("", "tenure-dashboard-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := etcdembed.Start(dir)
	if err != nil {
		return err
	}
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var cs []*candidate
	for i := 1; i <= 3; i++ {
		c := &candidate{name: fmt.Sprintf("c%d", i), resign: make(chan struct{}, 1), reg: prometheus.NewRegistry()}
		if c.proxy, err = faultproxy.New(srv.Endpoint); err != nil {
			return err
		}
		defer c.proxy.Close()
		if c.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{c.proxy.Addr()}, Logger: zap.NewNop()}); err != nil {
			return err
		}
		defer c.cli.Close()
		m, err := election.NewMetrics(c.reg)
		if err != nil {
			return err
		}
		if c.e, err = election.New(etcdelect.New(c.cli), election.Config{Key: "dashboard", Identity: c.name, TTL: ttl}, election.WithMetrics(m)); err != nil {
			return err
		}
		cs = append(cs, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.e.Run(ctx, tenure.Callbacks{OnElected: func(lctx context.Context, _ tenure.Term) {
				select {
				case <-lctx.Done():
				case <-c.resign:
				}
			}})
		}()
	}
	start := time.Now()
	series := map[string][]sample{}
	var events []event
	var smu sync.Mutex
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
			at := time.Since(start).Seconds()
			for _, c := range cs {
				c.mu.Lock()
				dead := c.dead
				c.mu.Unlock()
				if dead {
					continue // a killed process is not scraped
				}
				v := scrape(c.reg)
				smu.Lock()
				series[c.name] = append(series[c.name], sample{at, v["tenure_is_leader"], v["tenure_term"], v["tenure_lease_remaining_seconds"], v["tenure_suspended"]})
				smu.Unlock()
			}
		}
	}()
	mark := func(what string) {
		smu.Lock()
		events = append(events, event{time.Since(start).Seconds(), what})
		smu.Unlock()
	}
	leader := func() *candidate {
		for {
			for _, c := range cs {
				if c.e.IsLeader() {
					return c
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(2 * time.Second)
	l := leader()
	mark(l.name + " resigns")
	l.resign <- struct{}{}
	time.Sleep(2 * time.Second)
	l = leader()
	mark(l.name + " killed")
	l.mu.Lock()
	l.dead = true
	l.mu.Unlock()
	l.cli.Close()
	time.Sleep(3500 * time.Millisecond)
	l = leader()
	mark(l.name + " cut off")
	l.proxy.Blackhole()
	time.Sleep(3 * time.Second)
	mark(l.name + " healed")
	l.proxy.Heal()
	time.Sleep(2 * time.Second)
	close(stopSampling)
	<-sampled
	cancel()
	wg.Wait()
	for _, c := range cs {
		_ = c.e.Close(context.Background())
	}
	return os.WriteFile(out, []byte(render(series, events, time.Since(start).Seconds())), 0o644)
}

// scrape gathers reg and returns each gauge's value by name.
func scrape(reg *prometheus.Registry) map[string]float64 {
	v := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		return v
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				v[mf.GetName()] = g.GetValue()
			}
		}
	}
	return v
}

var colors = map[string]string{"c1": "#1f77b4", "c2": "#ff7f0e", "c3": "#2ca02c"}

func render(series map[string][]sample, events []event, span float64) string {
	const w, ph, left, top = 960, 150, 70, 40
	panels := []struct {
		title string
		get   func(sample) float64
		max   float64
	}{
		{"tenure_is_leader", func(s sample) float64 { return s.leader }, 1},
		{"tenure_term", func(s sample) float64 { return s.term }, 0},
		{"tenure_lease_remaining_seconds", func(s sample) float64 { return s.remaining }, ttl.Seconds()},
		{"tenure_suspended", func(s sample) float64 { return s.suspended }, 1},
	}
	for i := range panels {
		if panels[i].max == 0 {
			for _, ss := range series {
				for _, s := range ss {
					panels[i].max = max(panels[i].max, panels[i].get(s))
				}
			}
			panels[i].max *= 1.1
		}
	}
	height := top + len(panels)*(ph+40) + 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w+20, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15">tenure on embedded etcd, TTL %v: three candidates, scraped every 100 ms</text>`+"\n", left, ttl)
	x := func(t float64) float64 { return left + t/span*float64(w-left) }
	for i, p := range panels {
		y0 := float64(top + i*(ph+40) + 20)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-6, p.title)
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, y0, w-left, ph)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.4g</text><text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, y0+10, p.max, left-4, y0+float64(ph))
		y := func(v float64) float64 { return y0 + float64(ph) - v/p.max*float64(ph) }
		for _, name := range []string{"c1", "c2", "c3"} {
			var pts []string
			prev := -1.0
			for _, s := range series[name] {
				v := p.get(s)
				if prev >= 0 && p.title != "tenure_lease_remaining_seconds" {
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), y(prev))) // step
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), y(v)))
				prev = v
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", colors[name], strings.Join(pts, " "))
		}
		for _, ev := range events {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#888" stroke-dasharray="4 3"/>`+"\n", x(ev.at), x(ev.at), y0, y0+float64(ph))
			if i == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" fill="#555">%s</text>`+"\n", x(ev.at)+3, y0+24, html.EscapeString(ev.what))
			}
		}
	}
	ly := height - 12
	for i, name := range []string{"c1", "c2", "c3"} {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="14" height="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n", left+i*80, ly-4, colors[name], left+i*80+18, ly, name)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">seconds: 0 … %.1f</text>`, w, ly, span)
	b.WriteString("</svg>\n")
	return b.String()
}
