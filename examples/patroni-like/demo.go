package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/tenure-go/tenure/fence"
)

// Demo settings: a short TTL so that the failover shows in seconds.
const (
	demoTTL      = 3 * time.Second
	demoLoopWait = 500 * time.Millisecond
)

// runDemo starts an embedded etcd and three managers (this executable,
// re-run with --config) with their PostgreSQL on free loopback ports,
// writes through the primary, kills the primary's manager and PostgreSQL,
// shows the failover, brings the old member back as a standby, and removes
// everything it made.
func runDemo(ctx context.Context, out io.Writer) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "patroni-like-demo-")
	if err != nil {
		return err
	}
	if os.Getenv("PATRONI_LIKE_KEEP") == "" { // set it to keep the files, to debug
		defer os.RemoveAll(dir)
	}
	began := time.Now()
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "%+8.3fs  %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	show := func(ev Event) {
		switch ev.Event {
		case "bootstrap", "basebackup", "elected", "yield", "ineligible", "promoting", "open", "fenced", "demoted", "rewind":
		default:
			return
		}
		detail := ""
		if ev.Term != 0 {
			detail = fmt.Sprintf(" (term %d)", ev.Term)
		}
		if ev.Cause != "" {
			detail += ": " + ev.Cause
		}
		if ev.Event == "fenced" && ev.Drained {
			detail += fmt.Sprintf("; clean shutdown in %.0f ms, its standbys confirmed all its WAL", ev.Took*1000)
		}
		say("  [%s] %s%s", ev.Node, ev.Event, detail)
	}
	c, err := newLocalCluster(dir, 3, demoTTL, demoLoopWait, func(cfg string) *exec.Cmd {
		return exec.Command(self, "--config", cfg)
	}, show)
	if err != nil {
		return err
	}
	defer c.close()
	say("embedded etcd at %s; three members, TTL %v, loop_wait %v; files in %s", c.etcd.Endpoint, demoTTL, demoLoopWait, dir)
	for _, n := range c.names() {
		if err := c.start(n); err != nil {
			return err
		}
		m := c.member(n)
		say("%s: manager started, REST API %s, PostgreSQL %s", n, m.API, m.Postgres)
	}

	p1, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		return err
	}
	say("%s is the primary, term %d", p1.Name, p1.Term)
	for _, n := range c.names() {
		if n != p1.Name {
			if err := c.waitReplica(ctx, 90*time.Second, n); err != nil {
				return err
			}
		}
	}
	say("the other two stream from it")
	if err := demoWrites(ctx, c, p1, 3, say); err != nil {
		return err
	}
	if err := printCluster(ctx, c, p1.Name, say); err != nil {
		return err
	}

	say("killing %s's manager and its PostgreSQL (SIGKILL); its leader key stays until the TTL runs out", p1.Name)
	killed := time.Now()
	c.kill(p1.Name)
	p2, err := c.waitPrimary(ctx, 60*time.Second, p1.Name)
	if err != nil {
		return err
	}
	took := time.Since(killed)
	say("%s is the primary, term %d, %v after the kill (TTL %v + promotion)", p2.Name, p2.Term, took.Round(time.Millisecond), demoTTL)
	if err := demoWrites(ctx, c, p2, 3, say); err != nil {
		return err
	}
	conn, err := c.connect(ctx, p2.Name)
	if err != nil {
		return err
	}
	_, err = Write(ctx, conn, p1.Term, "from a client that still believes the old term")
	conn.Close(ctx)
	if !errors.Is(err, fence.ErrStale) {
		return fmt.Errorf("a write under the old term %d was not refused as stale: %v", p1.Term, err)
	}
	say("a write under the old term %d is refused: %v", p1.Term, err)

	say("restarting %s's manager: it rewinds its data onto %s's timeline and rejoins as a standby", p1.Name, p2.Name)
	if err := c.start(p1.Name); err != nil {
		return err
	}
	if err := c.waitReplica(ctx, 90*time.Second, p1.Name); err != nil {
		return err
	}
	say("%s streams from %s", p1.Name, p2.Name)
	if err := printCluster(ctx, c, p2.Name, say); err != nil {
		return err
	}
	say("failover: %s → %s, terms %d → %d, %v after the kill; stopping everything", p1.Name, p2.Name, p1.Term, p2.Term, took.Round(time.Millisecond))
	c.close()
	if os.Getenv("PATRONI_LIKE_KEEP") == "" {
		say("done; removing %s", dir)
	} else {
		say("done; keeping %s (PATRONI_LIKE_KEEP is set)", dir)
	}
	return nil
}

// demoWrites writes n rows through primary p under its term and reads the
// last one back on every standby.
func demoWrites(ctx context.Context, c *localCluster, p Status, n int, say func(string, ...any)) error {
	conn, err := c.connect(ctx, p.Name)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var id int64
	for i := range n {
		if id, err = Write(ctx, conn, p.Term, fmt.Sprintf("row %d via %s", i+1, p.Name)); err != nil {
			return err
		}
	}
	say("wrote %d rows through %s under term %d (last id %d)", n, p.Name, p.Term, id)
	for _, name := range c.names() {
		if name == p.Name {
			continue
		}
		if code, _, err := c.get(ctx, name, "/replica"); err != nil || code != 200 {
			continue
		}
		err := waitFor(ctx, 30*time.Second, "row on "+name, func(ctx context.Context) bool {
			rc, err := c.connect(ctx, name)
			if err != nil {
				return false
			}
			defer rc.Close(context.WithoutCancel(ctx))
			var term int64
			return rc.QueryRow(ctx, `SELECT term FROM rows WHERE id = $1`, id).Scan(&term) == nil
		})
		if err != nil {
			return err
		}
		say("  row %d read back on standby %s", id, name)
	}
	return nil
}

// printCluster prints GET /cluster as a table.
func printCluster(ctx context.Context, c *localCluster, via string, say func(string, ...any)) error {
	cl, err := c.clusterView(ctx, via)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "GET /cluster on %s: leader %s, term %d", via, cl.Leader, cl.Term)
	for _, m := range cl.Members {
		lag := "-"
		if m.Lag != nil {
			lag = fmt.Sprintf("%d B", *m.Lag)
		}
		fmt.Fprintf(&b, "\n            %-6s %-9s tl %d  lsn %-11s lag %s", m.Name, m.Role, m.Timeline, m.LSN, lag)
	}
	say("%s", b.String())
	return nil
}
