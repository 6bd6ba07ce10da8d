package main

import (
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writePlots draws, per backend, handoff latency (p50 solid, p99 dashed)
// and acquires per second against the contender count, and the crash
// failover of every implementation against its TTL. It returns each
// plot's path as the report links it (rel is dir seen from the report).
func writePlots(rs *results, dir, rel string) (map[string]string, error) {
	paths := map[string]string{}
	save := func(p *plot.Plot, name string, w, h vg.Length) error {
		if err := p.Save(w, h, filepath.Join(dir, name)); err != nil {
			return err
		}
		paths[name] = filepath.ToSlash(filepath.Join(rel, name))
		return nil
	}
	r := &report{rs: rs}
	for _, b := range backends {
		ns := r.counts(b.Bench)
		if len(ns) == 0 {
			continue
		}
		lat := plot.New()
		lat.Title.Text = b.Name + ": handoff latency (solid p50, dashed p99)"
		lat.X.Label.Text = "contenders"
		lat.Y.Label.Text = "ms"
		lat.X.Scale, lat.Y.Scale = plot.LogScale{}, plot.LogScale{}
		lat.X.Tick.Marker, lat.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		lat.Legend.Top = true
		thr := plot.New()
		thr.Title.Text = b.Name + ": acquires per second"
		thr.X.Label.Text = "contenders"
		thr.Y.Label.Text = "acquires/s"
		thr.X.Scale, thr.Y.Scale = plot.LogScale{}, plot.LogScale{}
		thr.X.Tick.Marker, thr.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		for i, impl := range append([]string{b.Tenure}, b.Peers...) {
			c := plotutil.Color(i)
			for _, u := range []string{"p50-ms", "p99-ms", "handoffs/s"} {
				var xys plotter.XYs
				for _, n := range ns {
					res := rs.lookup(b.Bench, impl, n)
					if res == nil || res.failed || res.skipped || !res.has(u) || res.metrics[u] <= 0 {
						continue
					}
					xys = append(xys, plotter.XY{X: float64(n), Y: res.metrics[u]})
				}
				if len(xys) == 0 {
					continue
				}
				l, pts, err := plotter.NewLinePoints(xys)
				if err != nil {
					return nil, err
				}
				l.Color, pts.Color = c, c
				l.Width = vg.Points(1.5)
				pts.Shape = plotutil.Shape(i)
				if u == "p99-ms" {
					l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				}
				name := shortLabel(impl)
				if u == "handoffs/s" {
					thr.Add(l, pts)
					thr.Legend.Add(name, l, pts)
					continue
				}
				lat.Add(l, pts)
				if u == "p50-ms" {
					lat.Legend.Add(name, l, pts)
				}
			}
		}
		if err := save(lat, "bench-"+b.Name+"-latency.svg", 7*vg.Inch, 4.5*vg.Inch); err != nil {
			return nil, err
		}
		if err := save(thr, "bench-"+b.Name+"-throughput.svg", 7*vg.Inch, 4*vg.Inch); err != nil {
			return nil, err
		}
	}

	// Failover: median and worst bars per implementation, and its TTL.
	var med, worst, ttl plotter.Values
	var names []string
	for _, impl := range failoverImpls {
		res := rs.lookup("BenchmarkFailover", impl, 0)
		if res == nil || !res.has("failover-ms") {
			continue
		}
		names = append(names, shortLabel(impl))
		med = append(med, res.metrics["failover-ms"])
		worst = append(worst, res.metrics["failover-max-ms"])
		ttl = append(ttl, res.metrics["ttl-ms"])
	}
	if len(names) > 0 {
		p := plot.New()
		p.Title.Text = "crash failover (SIGKILL → the next holder's command runs)"
		p.Y.Label.Text = "ms"
		w := vg.Points(14)
		for i, set := range []struct {
			v     plotter.Values
			label string
		}{{med, "median"}, {worst, "worst"}, {ttl, "TTL"}} {
			bars, err := plotter.NewBarChart(set.v, w)
			if err != nil {
				return nil, err
			}
			bars.Color = plotutil.Color(i)
			if set.label == "TTL" {
				bars.Color = color.Gray{Y: 170}
			}
			bars.LineStyle.Width = 0
			bars.Offset = vg.Length(i-1) * w
			p.Add(bars)
			p.Legend.Add(set.label, bars)
		}
		p.Legend.Top = true
		p.Legend.Left = true
		p.NominalX(names...)
		p.X.Tick.Label.Rotation = 0
		p.X.Tick.Label.XAlign = draw.XCenter
		if err := save(p, "bench-failover.svg", 7*vg.Inch, 4*vg.Inch); err != nil {
			return nil, err
		}
	}
	return paths, nil
}
