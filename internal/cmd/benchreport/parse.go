package main

import (
	"bufio"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// result is one sub-benchmark: BenchmarkX/impl=Y[/contenders=N], over all
// its rounds (/round=R, when -bench.repeat ran more than one).
type result struct {
	bench      string // "BenchmarkHandoff"
	impl       string
	contenders int // 0 when the benchmark has none
	// metrics holds each figure; over several rounds, its median.
	metrics map[string]float64
	// rounds holds each round's figures, in the order the rounds ran.
	rounds  []map[string]float64
	notes   []string // the lines a skip or a failure printed
	failed  bool
	skipped bool
}

func (r *result) has(unit string) bool { _, ok := r.metrics[unit]; return ok }

// results holds every sub-benchmark of a run, by name.
type results struct {
	byName map[string]*result
	order  []string
	failed bool // the run failed (a FAIL line)
}

var nameRE = regexp.MustCompile(`^(Benchmark[A-Za-z0-9]+)/impl=([^/\s]+?)(?:/contenders=(\d+))?(?:/round=(\d+))?(?:-\d+)?$`)

// get returns the result name belongs to, and the map its figures go in
// (that round's, when name has one).
func (rs *results) get(name string) (*result, map[string]float64) {
	m := nameRE.FindStringSubmatch(name)
	if m == nil {
		return nil, nil
	}
	key := m[1] + "/" + m[2] + "/" + m[3]
	r, ok := rs.byName[key]
	if !ok {
		n, _ := strconv.Atoi(m[3])
		r = &result{bench: m[1], impl: m[2], contenders: n, metrics: map[string]float64{}}
		rs.byName[key] = r
		rs.order = append(rs.order, key)
	}
	if m[4] == "" {
		return r, r.metrics
	}
	round, _ := strconv.Atoi(m[4])
	for len(r.rounds) < round {
		r.rounds = append(r.rounds, map[string]float64{})
	}
	return r, r.rounds[round-1]
}

// merge sets each figure of a result that ran in rounds to its median over
// the rounds that reported it (the mean of the middle two for an even
// count).
func (r *result) merge() {
	if len(r.rounds) == 0 {
		return
	}
	vals := map[string][]float64{}
	for _, m := range r.rounds {
		for unit, v := range m {
			vals[unit] = append(vals[unit], v)
		}
	}
	for unit, vs := range vals {
		slices.Sort(vs)
		mid := len(vs) / 2
		if len(vs)%2 == 1 {
			r.metrics[unit] = vs[mid]
		} else {
			r.metrics[unit] = (vs[mid-1] + vs[mid]) / 2
		}
	}
}

// lookup returns the result of bench/impl at n contenders, or nil.
func (rs *results) lookup(bench, impl string, n int) *result {
	key := bench + "/" + impl + "/"
	if n > 0 {
		key += strconv.Itoa(n)
	}
	return rs.byName[key]
}

// parse reads the standard output of `go test -bench` (not -json): result
// lines, and the "--- SKIP/FAIL/BENCH:" blocks with their indented
// messages.
func parse(r io.Reader) (*results, error) {
	rs := &results{byName: map[string]*result{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var cur *result // the result whose messages follow
	var figures map[string]float64
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(line, "Benchmark") {
			// A sub-benchmark that fails or skips before it reports prints
			// its name, then the "--- FAIL:" or "--- SKIP:" line, on one
			// line ("BenchmarkX/impl=y/round=2-2 \t--- FAIL: BenchmarkX/...").
			if _, after, ok := strings.Cut(line, "\t--- "); ok {
				trimmed = "--- " + strings.TrimSpace(after)
			}
		}
		switch {
		case strings.HasPrefix(trimmed, "--- "):
			word, rest, _ := strings.Cut(strings.TrimPrefix(trimmed, "--- "), ": ")
			cur, _ = rs.get(strings.TrimSpace(rest))
			if cur != nil {
				switch word {
				case "FAIL":
					cur.failed = true
				case "SKIP":
					cur.skipped = true
				}
			}
			if word == "FAIL" {
				rs.failed = true
			}
		case strings.HasPrefix(line, "Benchmark"):
			f := strings.Fields(line)
			cur, figures = rs.get(f[0])
			if cur == nil || len(f) < 2 {
				continue
			}
			if f[1] == "0" || (len(f) == 2) {
				continue // no run: a skip or failure follows
			}
			for i := 2; i+1 < len(f); i += 2 {
				v, err := strconv.ParseFloat(f[i], 64)
				if err == nil {
					figures[f[i+1]] = v
				}
			}
		case strings.HasPrefix(line, "    ") && cur != nil:
			msg := trimmed
			if _, after, ok := strings.Cut(msg, ".go:"); ok {
				if _, m, ok := strings.Cut(after, ": "); ok {
					msg = m
				}
			}
			if !slices.Contains(cur.notes, msg) { // every round says it again
				cur.notes = append(cur.notes, msg)
			}
		case strings.HasPrefix(line, "FAIL"):
			rs.failed = true
		default:
			cur = nil
		}
	}
	// A result with no figures was skipped (b.Skip in a benchmark prints
	// "--- BENCH:" or "--- SKIP:").
	for _, r := range rs.byName {
		r.merge()
		if len(r.metrics) == 0 && !r.failed {
			r.skipped = true
		}
	}
	return rs, sc.Err()
}
