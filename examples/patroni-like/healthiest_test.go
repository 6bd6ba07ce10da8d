package main

import (
	"context"
	"os"
	"sort"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestFailover_TheCandidateWithMoreWALIsPromoted: after the primary dies,
// the member next in the election's queue is promoted only if no other
// candidate has received WAL it has not. Here the next in line stopped
// receiving WAL before the primary's last commit, which reached the other
// standby only. The next in line yields (its term ends with PostgreSQL
// untouched), the other standby is promoted, and the last commit survives.
// Before, the next in line was promoted and the commit was lost.
func TestFailover_TheCandidateWithMoreWALIsPromoted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, primary, next, other, id := oneStandbyBehind(ctx, t)

	killed := time.Now()
	c.kill(primary.Name)
	newPrimary, err := c.waitPrimary(ctx, 60*time.Second, primary.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s killed; %s primary %v later (term %d)", primary.Name, newPrimary.Name, time.Since(killed).Round(time.Millisecond), newPrimary.Term)
	if newPrimary.Name != other {
		t.Fatalf("%s was promoted, without the last commit that %s had", newPrimary.Name, other)
	}
	if n, err := rowCount(ctx, c, other, id); err != nil || n != 1 {
		t.Fatalf("row %d on the new primary %s: %d copies (err %v), want 1", id, other, n, err)
	}
	h := history{events: c.eventLog()}
	yields := 0
	for _, e := range h.events {
		if e.Node == next && e.Event == "yield" {
			yields++
			if e.To != other {
				t.Errorf("%s yielded (term %d) to %q, want %q", next, e.Term, e.To, other)
			}
		}
		if e.Node == next && e.Event == "promoting" {
			t.Errorf("%s began a promotion (term %d) although %s had more WAL", next, e.Term, other)
		}
	}

	if yields == 0 {
		t.Errorf("no yield event from %s", next)
	}

	// Once it receives WAL again, the member that yielded streams from
	// the new primary: its data was left as it was.
	stopReceiving(ctx, t, c, next, false)
	readRow(ctx, t, c, next, id, primary.Term)
}

// stopReceiving makes member n's PostgreSQL stop receiving WAL (stop
// true), and waits until it does, or lets it receive again. ALTER SYSTEM
// outranks the manager's settings, which it does not write again while
// the member's upstream stays the same.
func stopReceiving(ctx context.Context, t *testing.T, c *localCluster, n string, stop bool) {
	t.Helper()
	conn, err := c.connect(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	q := `ALTER SYSTEM SET primary_conninfo = ''`
	if !stop {
		q = `ALTER SYSTEM RESET primary_conninfo`
	}
	_, err = conn.Exec(ctx, q)
	if err == nil {
		_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	}
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stop {
		if err := waitFor(ctx, 30*time.Second, n+" not streaming", func(ctx context.Context) bool { return !streaming(ctx, c, n) }); err != nil {
			t.Fatal(err)
		}
	}
}

// reconfigure applies f to every member's configuration file; call it
// before the members start.
func reconfigure(t *testing.T, c *localCluster, f func(*Config)) {
	t.Helper()
	for i := range c.cfgs {
		f(&c.cfgs[i])
		b, err := c.cfgs[i].Marshal()
		if err == nil {
			err = os.WriteFile(c.configPath(c.cfgs[i].Name), b, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestFailover_NoStandbyTooFarBehindIsPromoted: a standby further behind
// the primary's last recorded WAL position (the optime key) than
// dcs.maximum_lag_on_failover is not promoted when the primary dies: the
// cluster stays without a primary, the standby out of the election (and
// yielding a term it was given before it saw its lag), until the old
// primary comes back; that one is promoted, with every commit. Before, the standby was promoted and the commits it had
// not received were lost.
func TestFailover_NoStandbyTooFarBehindIsPromoted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const maxLag = 64 << 10
	c, _ := testCluster(t, 2)
	reconfigure(t, c, func(cfg *Config) { cfg.DCS.MaximumLagOnFailover = maxLag })
	primary, standby := twoMembers(ctx, t, c)
	stopReceiving(ctx, t, c, standby, true)

	// About 1 MiB of WAL the standby does not receive, and a row.
	conn, err := c.connect(ctx, primary.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The test's members run with synchronous_commit off: this session
	// waits for its WAL to be written, so that the row survives the
	// primary's crash.
	_, err = conn.Exec(ctx, `SET synchronous_commit = on`)
	if err == nil {
		_, err = conn.Exec(ctx, `CREATE TABLE filler AS SELECT g, md5(g::text) AS h FROM generate_series(1, 10000) g`)
	}
	var id int64
	if err == nil {
		id, err = Write(ctx, conn, primary.Term, "the standby never received this")
	}
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cli := dcsClient(t, c)
	var lag uint64
	err = waitFor(ctx, 30*time.Second, "the optime key past the standby by more than the limit", func(ctx context.Context) bool {
		r, err := cli.Get(ctx, c.cfgs[0].OptimeKey())
		if err != nil || len(r.Kvs) != 1 {
			return false
		}
		_, st, err := c.get(ctx, standby, "/status")
		if err != nil {
			return false
		}
		optime, ok1 := parseLSN(string(r.Kvs[0].Value))
		own, ok2 := parseLSN(st.ReceivedLSN)
		if !ok1 || !ok2 || optime <= own {
			return false
		}
		lag = optime - own
		return lag > maxLag
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s is %d bytes behind the optime", standby, lag)

	killed := time.Now()
	c.kill(primary.Name)
	// Nobody is promoted: the standby stops standing for election once
	// its loop sees the lag, and yields if it was elected before that.
	watch := 4 * testTTL
	for time.Since(killed) < watch {
		if p := c.primaries(ctx); len(p) > 0 {
			t.Fatalf("%s promoted %v after the primary died, %d bytes behind its last position (limit %d)",
				p[0].Name, time.Since(killed).Round(time.Millisecond), lag, maxLag)
		}
		sleep(ctx, 100*time.Millisecond)
	}
	h := history{events: c.eventLog()}
	told := 0
	for _, e := range h.events {
		if e.Node != standby {
			continue
		}
		if e.Event == "promoting" {
			t.Fatalf("%s began a promotion (term %d)", standby, e.Term)
		}
		if e.At.Before(killed) && e.Event == "ineligible" {
			told++ // out of the election already when the primary died
			continue
		}
		switch e.Event {
		case "yield":
			told++
			if e.To != "" {
				t.Errorf("%s yielded to %q; want a yield for lag", standby, e.To)
			}
		case "ineligible":
			told++
		}
	}
	if told == 0 {
		t.Fatalf("%s neither left the election (ineligible) nor yielded a term", standby)
	}
	_, st, err := c.get(ctx, standby, "/status")
	if err != nil {
		t.Fatal(err)
	}
	if st.Candidate || st.Ineligible == "" {
		t.Fatalf("%s's status: candidate %v, ineligible %q; want out of the election, saying why", standby, st.Candidate, st.Ineligible)
	}
	t.Logf("%s, %v after the primary died: %s", standby, watch, st.Ineligible)

	// The old primary comes back: its data is the newest, and it is
	// promoted with the row.
	if err := c.start(primary.Name); err != nil {
		t.Fatal(err)
	}
	back, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	if back.Name != primary.Name {
		t.Fatalf("%s promoted, want %s, the member with every commit", back.Name, primary.Name)
	}
	if n, err := rowCount(ctx, c, primary.Name, id); err != nil || n != 1 {
		t.Fatalf("row %d on %s: %d copies (err %v), want 1", id, primary.Name, n, err)
	}
}

// dcsClient is a client of c's etcd, closed at the test's end.
func dcsClient(t *testing.T, c *localCluster) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestStatus_StandbyTimelineWithoutAReceiver: a standby that followed a
// promotion reports the new timeline even once it receives nothing (its
// primary gone, its receiver stopped): checkHealthiest compares
// timelines first. Before, it reported its last restartpoint's timeline,
// which lags a switch by up to checkpoint_timeout, so a member with more
// WAL on the new timeline could yield to one rewound onto it with less.
func TestStatus_StandbyTimelineWithoutAReceiver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, _ := testCluster(t, 3)
	startAll(t, c)
	first, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.names() {
		if n != first.Name {
			if err := c.waitReplica(ctx, 90*time.Second, n); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.kill(first.Name)
	primary, err := c.waitPrimary(ctx, 60*time.Second, first.Name)
	if err != nil {
		t.Fatal(err)
	}
	var standby string
	for _, n := range c.names() {
		if n != first.Name && n != primary.Name {
			standby = n
		}
	}
	if err := c.waitReplica(ctx, 60*time.Second, standby); err != nil {
		t.Fatal(err)
	}
	_, pst, err := c.get(ctx, primary.Name, "/status")
	if err != nil {
		t.Fatal(err)
	}
	stopReceiving(ctx, t, c, standby, true)
	_, st, err := c.get(ctx, standby, "/status")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("primary %s on timeline %d; standby %s, not receiving, reports timeline %d", primary.Name, pst.Timeline, standby, st.Timeline)
	if st.Streaming || !st.InRecovery {
		t.Fatalf("%s: streaming %v, in recovery %v; want a standby that receives nothing", standby, st.Streaming, st.InRecovery)
	}
	if st.Timeline != pst.Timeline {
		t.Fatalf("%s reports timeline %d, its primary's is %d", standby, st.Timeline, pst.Timeline)
	}
}

// TestFailover_AMemberCutOffFromEtcdIsNotWaitedFor: the elected member
// defers only to members with an entry in the election's queue. Here the
// member with more WAL is cut off from etcd (its REST API still answers)
// when the primary dies: once its entry has expired, the next in line is
// promoted. Before, it deferred to any member whose manager was
// campaigning, which the cut-off one still was, so no member was ever
// promoted while the cut lasted.
func TestFailover_AMemberCutOffFromEtcdIsNotWaitedFor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c, primary, next, ahead, _ := oneStandbyBehind(ctx, t)

	c.proxies[ahead].Blackhole()
	defer c.proxies[ahead].Heal()
	killed := time.Now()
	c.kill(primary.Name)
	promoted, err := c.waitPrimary(ctx, 4*testTTL+10*time.Second, primary.Name)
	if err != nil {
		t.Fatalf("no primary while %s, which has more WAL, is cut off from etcd: %v", ahead, err)
	}
	t.Logf("%s killed, %s cut off from etcd: %s primary %v later", primary.Name, ahead, promoted.Name, time.Since(killed).Round(time.Millisecond))
	if promoted.Name != next {
		t.Fatalf("%s promoted, want %s (the other is cut off from etcd)", promoted.Name, next)
	}
}

// waitQueue waits until every member of c stands in the election's queue
// behind primary, the other members streaming, and returns the queue in
// the order the election serves it (create revision).
func waitQueue(ctx context.Context, t *testing.T, c *localCluster, primary string) []string {
	t.Helper()
	cli := dcsClient(t, c)
	var queue []string
	err := waitFor(ctx, 90*time.Second, "the standbys streaming and queued", func(ctx context.Context) bool {
		for _, n := range c.names() {
			if n != primary && !streaming(ctx, c, n) {
				return false
			}
		}
		r, err := cli.Get(ctx, c.cfgs[0].LeaderKey()+"/", clientv3.WithPrefix())
		if err != nil {
			return false
		}
		sort.Slice(r.Kvs, func(i, j int) bool { return r.Kvs[i].CreateRevision < r.Kvs[j].CreateRevision })
		queue = queue[:0]
		for _, kv := range r.Kvs {
			queue = append(queue, string(kv.Value))
		}
		return len(queue) == len(c.names()) && queue[0] == primary
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("queue: %v", queue)
	return queue
}

// oneStandbyBehind starts a three-member cluster and, once both standbys
// stream and stand in the queue, makes the next in line (next) stop
// receiving WAL and writes a row (id) on the primary that only the other
// standby (ahead) receives.
func oneStandbyBehind(ctx context.Context, t *testing.T) (c *localCluster, primary Status, next, ahead string, id int64) {
	t.Helper()
	c, _ = testCluster(t, 3)
	startAll(t, c)
	primary, err := c.waitPrimary(ctx, 90*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}
	queue := waitQueue(ctx, t, c, primary.Name)
	next, ahead = queue[1], queue[2]
	stopReceiving(ctx, t, c, next, true)
	conn, err := c.connect(ctx, primary.Name)
	if err != nil {
		t.Fatal(err)
	}
	id, err = Write(ctx, conn, primary.Term, "only "+ahead+" has this")
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	readRow(ctx, t, c, ahead, id, primary.Term)
	if n, err := rowCount(ctx, c, next, id); err != nil || n != 0 {
		t.Fatalf("%s has %d copies of row %d (err %v); the test needs it behind", next, n, id, err)
	}
	return c, primary, next, ahead, id
}
