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
		// Through Multi: Create checks the path in go-zookeeper first (it
		// refuses U+FFF0 itself), and the claim is about the server.
		_, err := raw.Multi(&zk.CreateRequest{Path: k, Acl: zk.WorldACL(zk.PermAll)})
		if err == nil {
			_ = raw.Delete(k, -1)
		}
		if !errors.Is(err, zk.ErrBadArguments) {
			t.Errorf("the server answered %v to a create of %q, which CheckKey refuses; want %v", err, k, zk.ErrBadArguments)
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

// TestBadInput_OversizedIdentityIsRefused: the identity is the node's
// data. One above the server's 1 MB request limit made the server drop the
// connection that every elector of the Backend shares; the create looked
// like a lost reply and was retried until the campaign's ctx ended (7
// reconnections in 8 s). Above MaxIdentityLen it is refused at once; at
// the limit it is taken.
func TestBadInput_OversizedIdentityIsRefused(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	b := dialWith(t)
	key := secKey(t)
	big := newZKElector(t, b, key, strings.Repeat("x", 1_100_000))
	start := time.Now()
	if _, err := big.Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Campaign with a 1.1 MB identity = %v, want ErrInvalidConfig", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("refused only after %v", took)
	}
	ok := newZKElector(t, b, key, strings.Repeat("y", zkelect.MaxIdentityLen))
	term, err := ok.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with an identity of MaxIdentityLen: %v", err)
	}
	if len(term.Identity) != zkelect.MaxIdentityLen {
		t.Fatalf("term identity of %d bytes", len(term.Identity))
	}
}

// TestBadInput_NilOptionIsIgnored: a nil Option changes nothing, as in
// election.New. Dial panicked on it before any network I/O.
func TestBadInput_NilOptionIsIgnored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := zkelect.Dial(ctx, server.Endpoints(), 4*time.Second, nil)
	if err != nil {
		t.Fatalf("Dial with a nil Option: %v", err)
	}
	b.Close()
}
