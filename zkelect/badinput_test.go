package zkelect_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/internal/faultproxy"
	"github.com/tenure-go/tenure/zkelect"
)

// TestBadInput_ZKKeysRefusedLikeTheServer: keys CheckKey refuses because
// the server would (characters ZooKeeper forbids, beyond U+FFFF included)
// are indeed refused by the server, and election.New refuses them before
// anything is created.
func TestBadInput_ZKKeysRefusedLikeTheServer(t *testing.T) {
	b := dialWith(t)
	raw := rawConn(t, "", "")
	for _, k := range []string{"/tenure-bad-\ue000", "/tenure-bad-🔒", "/tenure-bad-\ufff0"} {
		if _, err := election.New(b, election.Config{Key: k, TTL: ttl}); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("election.New(%q) = %v, want ErrInvalidConfig", k, err)
		}
		if _, err := raw.Create(k, nil, 0, zk.WorldACL(zk.PermAll)); err == nil {
			_ = raw.Delete(k, -1)
			t.Errorf("the server accepted %q, which CheckKey refuses", k)
		}
	}
	for _, k := range []string{"", "locks/a", "/", "/a/", "/a//b", "/a/../b", "/zookeeper/x", "/a\x00"} {
		if _, err := election.New(b, election.Config{Key: k, TTL: ttl}); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("election.New(%q) = %v, want ErrInvalidConfig", k, err)
		}
	}
}

// TestBadInput_ZKGarbageChildrenAreIgnored: children another client
// created under the key's node, persistent and holding binary data, whose
// names end in no sequence, neither block the queue nor show as leader, and
// tenure leaves them untouched and leaves nothing of its own.
func TestBadInput_ZKGarbageChildrenAreIgnored(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := secKey(t)
	raw := rawConn(t, "", "")
	parts := strings.Split(key[1:], "/")
	var nodes []string
	for i := range parts {
		nodes = append(nodes, "/"+strings.Join(parts[:i+1], "/"))
	}
	for _, p := range nodes {
		if _, err := raw.Create(p, []byte("\x00\xffgarbage"), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range []string{"readme", "x-lock-12", "lock-00000000001", "_c_-lock-"} {
			_ = raw.Delete(key+"/"+c, -1)
		}
		for i := len(nodes) - 1; i >= 0; i-- {
			_ = raw.Delete(nodes[i], -1)
		}
	})
	garbage := []string{"readme", "x-lock-12", "lock-00000000001", "_c_-lock-"}
	for _, c := range garbage {
		if _, err := raw.Create(key+"/"+c, []byte("\x1b[2J\x00binary"), 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	e := newZKElector(t, dialWith(t), key, "tenure")
	if l, err := e.Leader(ctx); err != nil || !l.Vacant {
		t.Fatalf("Leader with only garbage children = %+v, %v; want vacant", l, err)
	}
	term, err := e.TryCampaign(ctx)
	if err != nil {
		t.Fatalf("TryCampaign among garbage = %v, want elected", err)
	}
	if l, err := e.Leader(ctx); err != nil || l.Term.Token != term.Token {
		t.Fatalf("Leader = %+v, %v; want tenure at %d", l, err, term.Token)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	children, _, err := raw.Children(key)
	slices.Sort(children)
	want := slices.Clone(garbage)
	slices.Sort(want)
	if err != nil || !slices.Equal(children, want) {
		t.Fatalf("children after resign = %q, %v; want the garbage only: %q", children, err, want)
	}
}

// TestBadInput_ZKConnectionCutMidCampaign: the server's connection closes
// (faultproxy's Cut) while a candidate waits; go-zookeeper reconnects within
// the session, and the campaign goes on to win when the leader resigns; a
// campaign cancelled around a cut returns ErrCanceled and leaves no node.
func TestBadInput_ZKConnectionCutMidCampaign(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := secKey(t)
	proxied := func(id string) (*election.Elector, *faultproxy.Proxy) {
		p, err := faultproxy.New(server.Endpoint(0))
		if err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		b, err := zkelect.Dial(dctx, []string{p.Addr()}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		e := newZKElector(t, b, key, id)
		t.Cleanup(func() { e.Close(context.Background()); b.Close(); p.Close() })
		return e, p
	}
	leader := newZKElector(t, dialWith(t), key, "leader")
	lt, err := leader.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w, wp := proxied("waiter")
	got := make(chan error, 1)
	var wt tenure.Term
	go func() {
		var err error
		wt, err = w.Campaign(ctx)
		got <- err
	}()
	waitUntil(t, "the waiter to queue", func() bool { n, err := w.Position(ctx); return err == nil && n == 1 })
	wp.Cut()
	time.Sleep(300 * time.Millisecond)
	if err := leader.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil || wt.Token <= lt.Token {
			t.Fatalf("Campaign after a cut = %v (token %d), want elected above %d", err, wt.Token, lt.Token)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiter whose connection was cut never got elected")
	}
	c, cp := proxied("cancelled")
	cctx, cancel := context.WithCancel(ctx)
	cerr := make(chan error, 1)
	go func() {
		_, err := c.Campaign(cctx)
		cerr <- err
	}()
	waitUntil(t, "the second waiter to queue", func() bool { n, err := c.Position(ctx); return err == nil && n == 1 })
	cp.Cut()
	cancel()
	select {
	case err := <-cerr:
		if !errors.Is(err, tenure.ErrCanceled) {
			t.Fatalf("cancelled Campaign = %v, want ErrCanceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("cancelled Campaign did not return")
	}
	raw := rawConn(t, "", "")
	waitUntil(t, "the cancelled candidate's node to go", func() bool {
		ch, _, err := raw.Children(key)
		return err == nil && len(ch) == 1 && key+"/"+ch[0] == wt.Entry
	})
}
