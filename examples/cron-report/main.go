// Command cron-report is the cron scenario of tenure's Redis backend from
// end to end: an hourly report job on four replicas, each started by cron
// through `tenure exec --backend redis --no-wait`, so that one builds the
// report and three exit. See README.md.
//
//	cron-report report --date 2025-06-01T09 --redis HOST:PORT   the job
//	cron-report [--demo]                                         the demo
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// dateLayout is the report's date key: one report per UTC hour.
const dateLayout = "2006-01-02T15"

// run is the command line; it returns the exit status: 0, 1 on failure, 2
// on bad usage.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "report" {
		return cmdReport(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("cron-report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	demo := fs.Bool("demo", true, "run the demo (the default): a redis-server, four replicas, three simulated hours; cleans up after itself")
	tenureBin := fs.String("tenure", "", "use this tenure `binary` instead of building ./cmd/tenure from the module")
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage:
  cron-report [--demo] [--tenure PATH]   the demo (about 15 s after the build)
  cron-report report --date YYYY-MM-DDTHH (--redis HOST:PORT | --dir DIR) [--duration D] [--run-log FILE]
                                         the hourly job that tenure exec runs

Flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || !*demo {
		fmt.Fprintf(stderr, "cron-report: nothing to do with %q (want --demo, or report ...)\n", args)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runDemo(ctx, *tenureBin, stdout); err != nil {
		fmt.Fprintf(stderr, "cron-report --demo: %v\n", err)
		if ctx.Err() != nil {
			return 130 // interrupted (SIGINT or SIGTERM)
		}
		return 1
	}
	return 0
}

// cmdReport is the hourly job: it builds the report of one hour and writes
// it under the hour's key, so that a second run of the same hour overwrites
// the first instead of adding a second report.
func cmdReport(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	date := fs.String("date", "", "the hour to report on, `YYYY-MM-DDTHH` (UTC)")
	addr := fs.String("redis", "", "write the report to Redis key report:DATE on `HOST:PORT`")
	dir := fs.String("dir", "", "write the report to `DIR`/DATE.txt (temporary file, then rename)")
	duration := fs.Duration("duration", time.Second, "how long building the report takes")
	runLog := fs.String("run-log", "", "append one line per run to `FILE` (date, TENURE_TERM, TENURE_IDENTITY, pid, start time)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "report: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if _, err := time.Parse(dateLayout, *date); err != nil {
		fmt.Fprintf(stderr, "report: --date %q: want YYYY-MM-DDTHH (UTC hour)\n", *date)
		return 2
	}
	if *addr == "" && *dir == "" {
		fmt.Fprintln(stderr, "report: --redis HOST:PORT or --dir DIR is required")
		return 2
	}
	if *duration < 0 {
		fmt.Fprintf(stderr, "report: --duration %v must not be negative\n", *duration)
		return 2
	}
	start := time.Now()
	if *runLog != "" {
		// Logged when the run starts, so that a run stopped half-way
		// (tenure lost the lock and sent SIGTERM) counts too.
		if err := appendRunLog(*runLog, *date, start); err != nil {
			fmt.Fprintf(stderr, "report: --run-log: %v\n", err)
			return 1
		}
	}
	// tenure exec sends SIGTERM when it loses the lock (or is stopped):
	// stop building and write nothing.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	select {
	case <-time.After(*duration):
	case <-ctx.Done():
		fmt.Fprintf(stderr, "report %s: stopped after %v; nothing written\n", *date, time.Since(start).Round(time.Millisecond))
		return 1
	}
	body := buildReport(*date)
	var where []string
	if *addr != "" {
		// Not on ctx: a SIGTERM from here on does not stop the write (go-
		// redis would give up a dial in progress on it).
		if err := writeRedis(context.WithoutCancel(ctx), *addr, *date, body); err != nil {
			fmt.Fprintf(stderr, "report %s: %v\n", *date, err)
			return 1
		}
		where = append(where, "redis key "+reportKey(*date))
	}
	if *dir != "" {
		p, err := writeFile(*dir, *date, body)
		if err != nil {
			fmt.Fprintf(stderr, "report %s: %v\n", *date, err)
			return 1
		}
		where = append(where, p)
	}
	fmt.Fprintf(stdout, "report %s: built by %s (term %s) in %v, written to %s\n", *date,
		orDash(os.Getenv("TENURE_IDENTITY")), orDash(os.Getenv("TENURE_TERM")),
		time.Since(start).Round(time.Millisecond), strings.Join(where, " and "))
	return 0
}

// reportKey is the Redis key of date's report.
func reportKey(date string) string { return "report:" + date }

// buildReport computes date's report: made-up order figures drawn from a
// generator seeded by the date, so every run for one hour produces the same
// bytes.
func buildReport(date string) string {
	h := fnv.New64a()
	h.Write([]byte(date))
	r := rand.New(rand.NewPCG(h.Sum64(), 0))
	orders := 100 + r.IntN(900)
	var cents int64
	for range orders {
		cents += 100 + r.Int64N(20000)
	}
	body := fmt.Sprintf("hourly report %s\norders %d\nrevenue %d.%02d\n", date, orders, cents/100, cents%100)
	sum := sha256.Sum256([]byte(body))
	return body + "checksum " + hex.EncodeToString(sum[:6]) + "\n"
}

// writeRedis stores the report with a plain SET: a second run of the same
// hour replaces the value.
func writeRedis(ctx context.Context, addr, date, body string) error {
	c := newRedisClient(addr)
	defer c.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Set(wctx, reportKey(date), body, 0).Err(); err != nil {
		return fmt.Errorf("SET %s on %s: %w", reportKey(date), addr, err)
	}
	return nil
}

// newRedisClient connects to one Redis server, without go-redis's
// maintenance-notification handshake (not needed on a plain server).
// go-redis's own log lines (a failed dial, printed to stderr on each
// retry) are dropped: the error comes back to the caller, which says it
// once.
func newRedisClient(addr string) *redis.Client {
	redis.SetLogger(quietRedis{}) // process-wide
	return redis.NewClient(&redis.Options{
		Addr:                     addr,
		DialTimeout:              5 * time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// quietRedis is a go-redis logger that prints nothing.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// writeFile writes the report to dir/DATE.txt through a temporary file and a
// rename, so that a reader sees the old report or the new one, never half
// of one, and a second run replaces the file.
func writeFile(dir, date, body string) (string, error) {
	f, err := os.CreateTemp(dir, "."+date+".*.tmp")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, date+".txt")
	_, err = f.WriteString(body)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", err
	}
	return p, nil
}

// appendRunLog appends one line for this run. The line is written with one
// write on a file opened with O_APPEND, so concurrent runs do not interleave.
func appendRunLog(path, date string, start time.Time) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("date=%s term=%s identity=%s pid=%d start=%s\n", date,
		orDash(os.Getenv("TENURE_TERM")), orDash(os.Getenv("TENURE_IDENTITY")),
		os.Getpid(), start.UTC().Format(time.RFC3339Nano))
	_, err = f.WriteString(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// orDash is s, or "-" when s is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
