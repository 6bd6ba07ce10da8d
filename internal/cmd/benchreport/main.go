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
// name with .txt for .md), headed by the run's date and command, so that
// every figure can be traced to its line and the report rendered again
// (after a change to the template) without running the benchmarks again.
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
	status := 0
	if *in != "" {
		b, err := os.ReadFile(*in)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchreport:", err)
			return 1
		}
		raw = b
		savedDate, savedCommand := savedHeader(raw)
		command, date = *commandText, savedDate
		if command == "" {
			command = savedCommand
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
		if *out != "-" {
			saved := strings.TrimSuffix(*out, filepath.Ext(*out)) + ".txt"
			head := fmt.Sprintf("%s%s\n%s%s\n", dateHeader, date, commandHeader, command)
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
)

// savedHeader returns the date and command a saved run starts with, or
// empty strings.
func savedHeader(raw []byte) (date, command string) {
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, dateHeader):
			date = strings.TrimPrefix(line, dateHeader)
		case strings.HasPrefix(line, commandHeader):
			command = strings.TrimPrefix(line, commandHeader)
		default:
			return date, command
		}
	}
	return date, command
}
