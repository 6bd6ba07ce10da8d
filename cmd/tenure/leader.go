package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/tenure-go/tenure"
)

type leaderJSON struct {
	Key      string `json:"key"`
	Vacant   bool   `json:"vacant"`
	Identity string `json:"identity,omitempty"`
	Term     uint64 `json:"term,omitempty"`
	Backend  string `json:"backend"`
}

func cmdLeader(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	var c common
	c.register(fs)
	watch := fs.Bool("watch", false, "print every change of leader until interrupted")
	asJSON := fs.Bool("json", false, "print JSON objects, one a line")
	ttl := fs.Duration("ttl", 10*time.Second, "zk: the observer's session timeout, which the server's min/maxSessionTimeout must allow (etcd and redis ignore it)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: tenure leader --key KEY [--backend etcd|zk|redis] [--endpoints HOST:PORT,...] [--ttl 10s] [--watch] [--json]

Prints the holder of KEY as "IDENTITY term=N" (or "vacant"), and exits 3
when KEY is vacant. Examples:
  tenure leader --key report
  TENURE_ENDPOINTS=10.0.0.1:2379 tenure leader --key report --watch --json

Flags:
`)
		fs.PrintDefaults()
	}
	rest, err := parse(fs, args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err == nil && len(rest) > 0 {
		err = fmt.Errorf("unexpected arguments %q", rest)
	}
	if err == nil {
		err = c.validate()
	}
	if err == nil && c.backend == "zookeeper" {
		err = c.checkTTL(*ttl)
	}
	if err != nil {
		fmt.Fprintf(stderr, "tenure leader: %s\n", oneLine(err))
		return exitUsage
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	ctx, caught, unwatch := cancelOnSignal(sigs)
	defer unwatch()
	// A signal ends --watch normally (0); it interrupts anything else.
	interrupted := func() (int, bool) {
		s := caught()
		if s == nil {
			return 0, false
		}
		fmt.Fprintf(stderr, "tenure leader: %v\n", s)
		return 128 + int(s.(syscall.Signal)), true
	}
	b, closeBackend, err := c.open(ctx, *ttl)
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		fmt.Fprintf(stderr, "tenure leader: %s\n", oneLine(err))
		return exitUsage
	}
	defer closeBackend()
	print := func(l tenure.Leader) {
		if *asJSON {
			out, _ := json.Marshal(leaderJSON{Key: c.key, Vacant: l.Vacant, Identity: l.Term.Identity, Term: l.Term.Token, Backend: b.Name()})
			fmt.Fprintln(stdout, string(out))
			return
		}
		if l.Vacant {
			fmt.Fprintln(stdout, "vacant")
			return
		}
		fmt.Fprintf(stdout, "%s term=%d\n", shown(l.Term.Identity), l.Term.Token)
	}
	if *watch {
		var last *tenure.Leader
		err := b.Observe(ctx, c.key, func(l tenure.Leader) {
			if last != nil && last.Vacant == l.Vacant && last.Term.Token == l.Term.Token {
				return // the backend may report the same leader twice
			}
			last = &l
			print(l)
		})
		if ctx.Err() != nil {
			return exitOK
		}
		fmt.Fprintf(stderr, "tenure leader: %s\n", oneLine(err))
		return exitFailure
	}
	rctx, cancel := context.WithTimeout(ctx, c.dialTimeout) // a backend that cannot answer must not hold a script
	defer cancel()
	l, err := b.Leader(rctx, c.key)
	if err != nil {
		if code, ok := interrupted(); ok {
			return code
		}
		if rctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("no answer within --dial-timeout %v (a member cut off from its cluster's quorum cannot serve the read): %w", c.dialTimeout, err)
		}
		fmt.Fprintf(stderr, "tenure leader: %s\n", oneLine(err))
		return exitFailure
	}
	print(l)
	if l.Vacant {
		return exitVacant
	}
	return exitOK
}
