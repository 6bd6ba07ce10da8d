// Command patroni-like is a small PostgreSQL manager in the spirit of
// Patroni, built on tenure's election: it keeps exactly one PostgreSQL
// primary among N members and fails over when the primary dies or is cut
// off. See README.md.
//
//	patroni-like --config node1.yaml   run one member's manager
//	patroni-like --demo                three members on an embedded etcd
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command line; it returns the exit status: 0, 1 on failure, 2 on
// bad usage or configuration.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == watchdogCommand { // started by the manager
		return runWatchdog(args[1:], stderr)
	}
	fs := flag.NewFlagSet("patroni-like", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "the member's YAML configuration `file`")
	demo := fs.Bool("demo", false, "run three members on an embedded etcd, fail the primary over, and clean up")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage:\n  patroni-like --config FILE   run one member's manager\n  patroni-like --demo          the failover demo (about 10 s)\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "patroni-like: unexpected arguments %q\n", fs.Args())
		return 2
	case *demo && *cfgPath != "":
		fmt.Fprintln(stderr, "patroni-like: --demo and --config exclude each other")
		return 2
	case *demo:
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := runDemo(ctx, stdout); err != nil {
			fmt.Fprintf(stderr, "patroni-like --demo: %v\n", err)
			return 1
		}
		return 0
	case *cfgPath == "":
		fmt.Fprintln(stderr, "patroni-like: --config FILE is required (or --demo)")
		fs.Usage()
		return 2
	}
	cfg, err := LoadConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "patroni-like: %v\n", err)
		return 2
	}
	log := newLogger(stdout)
	defer log.Sync() //nolint:errcheck // nothing to do about it
	m, err := NewManager(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "patroni-like: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := m.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "patroni-like: %v\n", err)
		return 1
	}
	return 0
}

// newLogger logs JSON lines to w, timestamps in RFC 3339 with nanoseconds.
func newLogger(w io.Writer) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), zapcore.InfoLevel)
	return zap.New(core)
}
