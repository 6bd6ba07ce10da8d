package zkelect_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/zkelect"
)

const billingPassword = "billing-secret-77e1"

var secKeys atomic.Int64

func secKey(t *testing.T) string {
	return fmt.Sprintf("/security-%d/%s/leader", secKeys.Add(1), strings.ReplaceAll(t.Name(), "/", "-"))
}

func dialWith(t *testing.T, opts ...zkelect.Option) *zkelect.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := zkelect.Dial(ctx, server.Endpoints(), ttl, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

// rawConn is a plain go-zookeeper connection, authenticated with digest
// user:password unless user is empty.
func rawConn(t *testing.T, user, password string) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect(server.Endpoints(), ttl, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	if user != "" {
		if err := c.AddAuth("digest", []byte(user+":"+password)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func newZKElector(t *testing.T, b *zkelect.Backend, key, id string) *election.Elector {
	t.Helper()
	e, err := election.New(b, election.Config{Key: key, Identity: id, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// TestSecurity_ZKDigestACLKeepsOthersOut: with WithDigestAuth, every node
// tenure creates (the key's node, its ancestors, the candidates' nodes) is
// readable, writable and deletable only by connections authenticated as the
// same user. A connection without credentials, with a wrong password or as
// another user can neither read, create, change nor delete them (so it can
// neither steal nor break leadership, and cannot see who leads); tenure
// campaigns from such connections fail at once with ErrInvalidConfig and
// leave no node; a second candidate with the right credentials takes over
// as usual.
func TestSecurity_ZKDigestACLKeepsOthersOut(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := secKey(t)
	holder := newZKElector(t, dialWith(t, zkelect.WithDigestAuth("billing", billingPassword)), key, "holder")
	term, err := holder.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with digest auth: %v", err)
	}
	owner := rawConn(t, "billing", billingPassword)
	want := zk.DigestACL(zk.PermAll, "billing", billingPassword)
	for _, p := range []string{term.Entry, key, key[:strings.LastIndexByte(key, '/')]} {
		acl, _, err := owner.GetACL(p)
		if err != nil || !slices.Equal(acl, want) {
			t.Fatalf("ACL of %s = %v, %v; want %v", p, acl, err, want)
		}
	}

	for _, who := range []struct{ name, user, password string }{
		{"no credentials", "", ""},
		{"wrong password", "billing", "wrong"},
		{"another user", "reports", "reports-secret"},
	} {
		t.Run(who.name, func(t *testing.T) {
			c := rawConn(t, who.user, who.password)
			noAuth := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, zk.ErrNoAuth) {
					t.Errorf("%s = %v, want %v", op, err, zk.ErrNoAuth)
				}
			}
			noAuth("Delete of the holder's node", c.Delete(term.Entry, -1))
			_, err := c.Set(term.Entry, []byte("mallory"), -1)
			noAuth("Set of the holder's node", err)
			_, _, err = c.Get(term.Entry)
			noAuth("Get of the holder's node", err)
			_, _, err = c.Children(key)
			noAuth("Children of the key", err)
			_, err = c.Create(key+"/_c_00000000-0000-4000-8000-000000000000-lock-", []byte("mallory"), zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
			noAuth("Create of a contender", err)
			_, err = c.SetACL(key, zk.WorldACL(zk.PermAll), -1)
			noAuth("SetACL of the key", err)

			b := dialWith(t, dialOpts(who.user, who.password)...)
			e := newZKElector(t, b, key, "mallory")
			start := time.Now()
			if _, err := e.Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) || !errors.Is(err, zk.ErrNoAuth) || !strings.Contains(err.Error(), "refused by the node's ACL") {
				t.Errorf("Campaign without the credentials = %v, want ErrInvalidConfig wrapping %v, saying the ACL refused it", err, zk.ErrNoAuth)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Campaign without the credentials took %v: it retried a refusal", d)
			}
			if _, err := e.Leader(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
				t.Errorf("Leader without the credentials = %v, want ErrInvalidConfig", err)
			}
		})
	}

	select {
	case <-holder.Done():
		t.Fatalf("the holder lost its term: %v", holder.Err())
	default:
	}
	children, _, err := owner.Children(key)
	if err != nil || len(children) != 1 || key+"/"+children[0] != term.Entry {
		t.Fatalf("children of %s = %v, %v; want only the holder's node", key, children, err)
	}
	// Another process of the same service (same credentials) queues and
	// takes over as usual.
	next := newZKElector(t, dialWith(t, zkelect.WithDigestAuth("billing", billingPassword)), key, "next")
	got := make(chan tenure.Term, 1)
	go func() {
		tn, err := next.Campaign(ctx)
		if err != nil {
			t.Errorf("second Campaign: %v", err)
		}
		got <- tn
	}()
	waitUntil(t, "the second candidate to queue", func() bool {
		n, err := next.Position(ctx)
		return err == nil && n == 1
	})
	if err := holder.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if tn := <-got; tn.Token <= term.Token {
		t.Fatalf("next token %d not above %d", tn.Token, term.Token)
	}
}

// TestSecurity_ZKKeyUnderAParentTheServiceMayNotWrite: an administrator
// made the key's ancestors, the top one writable by the administrator only
// and the service's own one by the service ("/apps" closed, "/apps/billing"
// open to billing). The server checks the create permission on the parent
// before it looks for the node, so re-creating "/apps/billing" answers
// NoAuth, not NodeExists: a campaign must take that for an ancestor that
// exists, create the key's node, and lead.
func TestSecurity_ZKKeyUnderAParentTheServiceMayNotWrite(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	const adminPassword = "admin-secret-1c9d"
	top := fmt.Sprintf("/security-%d", secKeys.Add(1))
	svc := top + "/billing"
	key := svc + "/leader"
	admin := rawConn(t, "admin", adminPassword)
	if _, err := admin.Create(top, nil, 0, zk.DigestACL(zk.PermAll, "admin", adminPassword)); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Create(svc, nil, 0, zk.DigestACL(zk.PermAll, "billing", billingPassword)); err != nil {
		t.Fatal(err)
	}
	// The premise: the service's create of its existing node is refused.
	raw := rawConn(t, "billing", billingPassword)
	if _, err := raw.Create(svc, nil, 0, zk.DigestACL(zk.PermAll, "billing", billingPassword)); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("billing's create of the existing %s = %v, want %v", svc, err, zk.ErrNoAuth)
	}

	e := newZKElector(t, dialWith(t, zkelect.WithDigestAuth("billing", billingPassword)), key, "billing-1")
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign under %s: %v", svc, err)
	}
	if !strings.HasPrefix(term.Entry, key+"/") || term.Token == 0 {
		t.Fatalf("term %+v: want an entry under %s and a token", term, key)
	}
	children, _, err := raw.Children(key)
	if err != nil || len(children) != 1 || key+"/"+children[0] != term.Entry {
		t.Fatalf("children of %s = %v, %v; want only the leader's node", key, children, err)
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if children, _, err := raw.Children(key); err != nil || len(children) != 0 {
		t.Fatalf("children of %s after Resign = %v, %v; want none", key, children, err)
	}

	// Where the service's node is missing too, the refusal stands: a clear
	// error at once, no node left.
	other := newZKElector(t, dialWith(t, zkelect.WithDigestAuth("billing", billingPassword)), top+"/reports/leader", "billing-2")
	start := time.Now()
	if _, err := other.Campaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) || !errors.Is(err, zk.ErrNoAuth) {
		t.Errorf("Campaign under the missing %s/reports = %v, want ErrInvalidConfig wrapping %v", top, err, zk.ErrNoAuth)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the refused Campaign took %v: it retried a refusal", d)
	}
	if ok, _, err := admin.Exists(top + "/reports"); err != nil || ok {
		t.Errorf("%s/reports exists = %v, %v; want it never made", top, ok, err)
	}
}

func dialOpts(user, password string) []zkelect.Option {
	if user == "" {
		return nil
	}
	return []zkelect.Option{zkelect.WithDigestAuth(user, password)}
}

// TestSecurity_ZKWorldReadLetsObserversSeeOnly: with WithCreatorACL(true),
// a connection without credentials sees who leads (Leader) but can neither
// delete the holder's node nor queue.
func TestSecurity_ZKWorldReadLetsObserversSeeOnly(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	key := secKey(t)
	holder := newZKElector(t, dialWith(t, zkelect.WithDigestAuth("billing", billingPassword), zkelect.WithCreatorACL(true)), key, "holder")
	term, err := holder.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	anon := rawConn(t, "", "")
	if d, _, err := anon.Get(term.Entry); err != nil || string(d) != "holder" {
		t.Fatalf("world-read Get = %q, %v; want holder", d, err)
	}
	if err := anon.Delete(term.Entry, -1); !errors.Is(err, zk.ErrNoAuth) {
		t.Fatalf("world-read Delete = %v, want %v", err, zk.ErrNoAuth)
	}
	e := newZKElector(t, dialWith(t), key, "observer")
	if l, err := e.Leader(ctx); err != nil || l.Term.Identity != "holder" || l.Term.Token != term.Token {
		t.Fatalf("observer's Leader = %+v, %v; want holder at %d", l, err, term.Token)
	}
	if _, err := e.TryCampaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("observer's TryCampaign = %v, want ErrInvalidConfig", err)
	}
	children, _, err := anon.Children(key)
	if err != nil || len(children) != 1 {
		t.Fatalf("children after the observer's campaign = %v, %v; want the holder's only", children, err)
	}
	select {
	case <-holder.Done():
		t.Fatalf("the holder lost its term: %v", holder.Err())
	default:
	}
}

// TestSecurity_ZKDefaultACLUnchanged: without security options, nodes are
// created world-open as before (backwards compatible), and WithCreatorACL
// without credentials is refused before connecting.
func TestSecurity_ZKDefaultACLUnchanged(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	key := secKey(t)
	e := newZKElector(t, dialWith(t), key, "open")
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	acl, _, err := rawConn(t, "", "").GetACL(term.Entry)
	if err != nil || !slices.Equal(acl, zk.WorldACL(zk.PermAll)) {
		t.Fatalf("default ACL = %v, %v; want world:anyone all", acl, err)
	}
	if _, err := zkelect.Dial(ctx, server.Endpoints(), ttl, zkelect.WithCreatorACL(false)); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("WithCreatorACL without credentials = %v, want ErrInvalidConfig", err)
	}
	if _, err := zkelect.Dial(ctx, server.Endpoints(), ttl, zkelect.WithDigestAuth("", "x")); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("WithDigestAuth with an empty user = %v, want ErrInvalidConfig", err)
	}
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestReap_GivesUpADeleteTheACLRefuses: the background delete of a node the
// session could not delete at once stops at a refusal of the key's ACL
// (logged once) instead of asking again every half second for as long as
// the session lives.
func TestReap_GivesUpADeleteTheACLRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := rawConn(t, "", "")
	key := fmt.Sprintf("/security-%d-nodelete", secKeys.Add(1))
	// Anyone may create under the key, no one may delete there.
	if _, err := admin.Create(key, nil, 0, []zk.ACL{{Perms: zk.PermAll &^ zk.PermDelete, Scheme: "world", ID: "anyone"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Delete(key, -1) }) // after the Backend's close: its child goes with the session
	core, logs := observer.New(zap.WarnLevel)
	_, sess := openSession(t, ctx, server.Endpoints(), ttl, zkelect.WithLogger(zap.New(core)))
	tk, err := sess.Enqueue(ctx, key, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Close(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Close with its node's delete refused = %v, want ErrInvalidConfig", err)
	}
	time.Sleep(2 * time.Second) // four retries' worth
	if n := logs.FilterMessageSnippet("cannot delete").Len(); n != 1 {
		t.Fatalf("%d warnings about the refused delete in 2 s, want 1 (the delete given up)", n)
	}
	if ok, _, err := admin.Exists(tk.Name); err != nil || !ok {
		t.Fatalf("the node is gone (%v, %v): the test shows nothing", ok, err)
	}
}
