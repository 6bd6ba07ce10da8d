// Command benchreport runs tenure's benchmarks (./test) and writes the
// report: docs/benchmarks.md from the template report.md.tmpl (the
// explanatory prose lives there; the tables, ratios, machine, versions,
// command and date are filled in), and the plots in docs/img. make bench
// and make bench-quick run it.
//
//	go run ./internal/cmd/benchreport [-benchtime 300x] [-out docs/benchmarks.md] [-img docs/img] [-- benchmark flags]
//	go run ./internal/cmd/benchreport -in docs/benchmarks.txt ...   (render a saved run's output)
//
// A run also saves the benchmarks' output next to the report (the report's
// name with .txt for .md), headed by the run's date, command, machine and
// the versions of what it ran, so that every figure can be traced to its
// line and the report rendered again (after a change to the template, on
// another machine) without running the benchmarks again and without
// naming the wrong machine.
//
// It streams the benchmark output to stdout, and exits non-zero when the
// run failed (two holders, a stall, a driver error): the report is still
// written, with the failed cells marked. Speed never fails it: it reports,
// it does not assert.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	os.Exit(run())
}

func run() int {
	in := flag.String("in", "", "read a saved `go test -bench` output instead of running the benchmarks")
	out := flag.String("out", "docs/benchmarks.md", "the report to write (- for stdout)")
	img := flag.String("img", "docs/img", "directory for the plots (empty: no plots)")
	benchtime := flag.String("benchtime", "300x", "go test -benchtime")
	bench := flag.String("bench", ".", "go test -bench")
	timeout := flag.String("timeout", "90m", "go test -timeout")
	title := flag.String("title", "", "a line under the report's title (bench-quick says it is the reduced set)")
	commandText := flag.String("command", "", "with -in: the command that produced the saved output, for the report")
	flag.Parse()
	benchArgs := flag.Args()

	var raw []byte
	var command, date string
	var sv saved // the run: its date, command, machine and versions
	status := 0
	if *in != "" {
		b, err := os.ReadFile(*in)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			return 1
		}
		raw = b
		sv = savedHeader(raw)
		command, date = *commandText, sv.date
		if command == "" {
			command = sv.command
		}
		if command == "" {
			command = "(rendered from " + *in + ")"
		}
	} else {
		args := []string{"test", "-count=1", "-run", "^$", "-bench", *bench, "-benchtime", *benchtime, "-timeout", *timeout, "./test/"}
		if len(benchArgs) > 0 {
			args = append(append(args, "-args"), benchArgs...)
		}
		command = "go " + shellJoin(args)
		fmt.Println(command)
		var buf bytes.Buffer
		cmd := exec.Command("go", args...)
		cmd.Stdout = io.MultiWriter(os.Stdout, &buf)
		cmd.Stderr = io.MultiWriter(os.Stderr, &buf)
		start := time.Now()
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "benchreport: the benchmarks failed: %v\n", err)
			status = 1
		}
		fmt.Printf("benchmarks took %v\n", time.Since(start).Round(time.Second))
		raw = buf.Bytes()
		date = reportDate(time.Now())
		sv = saved{date: date, command: command, machine: machine(), versions: versionRows()}
		if *out != "-" {
			saved := strings.TrimSuffix(*out, filepath.Ext(*out)) + ".txt"
			head := sv.header()
			if err := os.WriteFile(saved, append([]byte(head), raw...), 0o644); err != nil {
				fmt.Fprintln(os.Stderr, "benchreport:", err)
				return 1
			}
			fmt.Printf("wrote %s\n", saved)
		}
	}
	rs, err := parse(bytes.NewReader(raw))
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		return 1
	}
	if rs.failed {
		status = 1
	}
	rep := newReport(rs, command, *title)
	if date != "" {
		rep.Date = date
	}
	// The machine and versions are the run's, not this machine's: a
	// report rendered again elsewhere must not name the wrong CPU.
	if *in != "" {
		rep.Machine, rep.Version = "not recorded in "+*in, "not recorded in "+*in+"\n"
	}
	if sv.machine != "" {
		rep.Machine = sv.machine
	}
	if len(sv.versions) > 0 {
		rep.Version = versionTable(sv.versions)
	}
	if *img != "" {
		if err := os.MkdirAll(*img, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			return 1
		}
		rel := *img
		if *out != "-" {
			if r, err := filepath.Rel(filepath.Dir(*out), *img); err == nil {
				rel = r
			}
		}
		plots, err := writePlots(rs, *img, rel)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport: plots:", err)
			return 1
		}
		rep.Plots = plots
	}
	md, err := rep.render()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		return 1
	}
	if *out == "-" {
		os.Stdout.Write(md)
	} else if err := os.WriteFile(*out, md, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		return 1
	} else {
		fmt.Printf("wrote %s\n", *out)
	}
	if status != 0 {
		fmt.Fprintln(os.Stderr, "benchreport: FAIL: a benchmark failed (see the report's failed cells and the output above)")
	}
	return status
}

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " '^$*|\"\\") {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}

// The header lines of a saved run.
const (
	dateHeader    = "benchreport-date: "
	commandHeader = "benchreport-command: "
	machineHeader = "benchreport-machine: "
	versionHeader = "benchreport-version: " // component, a tab, its version
)

// saved is what a saved run records above the benchmarks' output: when and
// how it ran, and on what, so that a report rendered from it later (on
// another machine, after an upgrade) describes the run and not the
// machine it is rendered on.
type saved struct {
	date, command, machine string
	versions               [][2]string
}

// header is the saved run's header, one line per field.
func (s saved) header() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s%s\n%s%s\n%s%s\n", dateHeader, s.date, commandHeader, s.command, machineHeader, s.machine)
	for _, v := range s.versions {
		fmt.Fprintf(&sb, "%s%s\t%s\n", versionHeader, v[0], v[1])
	}
	return sb.String()
}

// savedHeader returns what a saved run's header records; fields it lacks
// (an older run's header, or output with no header) are empty. The
// header ends at the first line that is not one of its lines.
func savedHeader(raw []byte) saved {
	var s saved
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimRight(line, "\n")
		if v, ok := strings.CutPrefix(line, dateHeader); ok {
			s.date = v
		} else if v, ok := strings.CutPrefix(line, commandHeader); ok {
			s.command = v
		} else if v, ok := strings.CutPrefix(line, machineHeader); ok {
			s.machine = v
		} else if v, ok := strings.CutPrefix(line, versionHeader); ok {
			if c, ver, ok := strings.Cut(v, "\t"); ok {
				s.versions = append(s.versions, [2]string{c, ver})
			}
		} else {
			break
		}
	}
	return s
}
