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

	"golang.org/x/sys/unix"

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
		fmt.Fprintf(stderr, "tenure leader: %s\n", oneLine(envHint(fs, err)))
		return exitUsage
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, stopSignals...)
	defer signal.Stop(sigs)
	// A write to a stdout whose reader is gone (`tenure leader | head -1`)
	// must fail with EPIPE, handled below, not kill tenure by SIGPIPE (Go's
	// runtime does, for stdout, unless SIGPIPE is caught): the exit status
	// is the table's, not 141.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, caught, _, unwatch := cancelOnSignal(sigs)
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
	print := func(l tenure.Leader) error {
		if *asJSON {
			out, _ := json.Marshal(leaderJSON{Key: c.key, Vacant: l.Vacant, Identity: l.Term.Identity, Term: l.Term.Token, Backend: b.Name()})
			_, err := fmt.Fprintln(stdout, string(out))
			return err
		}
		if l.Vacant {
			_, err := fmt.Fprintln(stdout, "vacant")
			return err
		}
		_, err := fmt.Fprintf(stdout, "%s term=%d\n", shown(l.Term.Identity), l.Term.Token)
		return err
	}
	if *watch {
		// The watch also ends when nobody reads it any more: a write to
		// stdout fails, or stdout's reader is gone (\`tenure leader --watch
		// | head -1\`: head exits after the first line, and the next line
		// may be days away).
		wctx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		if f, ok := stdout.(*os.File); ok {
			go untilReaderGone(wctx, f, stopWatch)
		}
		var last *tenure.Leader
		var writeErr error
		err := b.Observe(wctx, c.key, func(l tenure.Leader) {
			if last != nil && last.Vacant == l.Vacant && last.Term.Token == l.Term.Token {
				return // the backend may report the same leader twice
			}
			last = &l
			// A reader that stalls (its pipe full) must not hold the
			// watch past a signal: the write waits in a goroutine of its
			// own, and the callback returns when the watch ends. Lines
			// stay in order: the next waits for this one.
			wrote := make(chan error, 1)
			go func() { wrote <- print(l) }()
			select {
			case err := <-wrote:
				if err != nil && writeErr == nil {
					writeErr = err
					stopWatch()
				}
			case <-wctx.Done():
			}
		})
		switch {
		case ctx.Err() != nil:
			return exitOK
		case writeErr != nil && !errors.Is(writeErr, syscall.EPIPE):
			fmt.Fprintf(stderr, "tenure leader: writing to stdout: %s\n", oneLine(writeErr))
			return exitFailure
		case wctx.Err() != nil:
			return exitOK // the reader is gone
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
	if err := print(l); err != nil && !errors.Is(err, syscall.EPIPE) {
		fmt.Fprintf(stderr, "tenure leader: writing to stdout: %s\n", oneLine(err))
		return exitFailure
	}
	if l.Vacant {
		return exitVacant
	}
	return exitOK
}

// untilReaderGone calls gone once f, a pipe or a socket, has no reader
// left (poll reports an error or a hang-up on it), or returns when ctx
// ends. On other files (a terminal, a regular file) it only waits for ctx.
func untilReaderGone(ctx context.Context, f *os.File, gone func()) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		var revents int16
		cerr := rc.Control(func(fd uintptr) {
			pfd := []unix.PollFd{{Fd: int32(fd)}} // no events asked: POLLERR, POLLHUP and POLLNVAL come anyway
			if n, err := unix.Poll(pfd, 200); err == nil && n == 1 {
				revents = pfd[0].Revents
			}
		})
		if cerr != nil {
			return
		}
		if revents&(unix.POLLERR|unix.POLLHUP) != 0 {
			gone()
			return
		}
		if revents&unix.POLLNVAL != 0 {
			return
		}
	}
}
