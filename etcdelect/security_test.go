package etcdelect_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/testpki"
)

// secureEtcd is an embedded etcd that serves TLS only, requires client
// certificates signed by its CA, and has authentication enabled, set up as
// docs/security.md tells: a role per service with readwrite on the
// service's own prefix and nothing else.
type secureEtcd struct {
	endpoint string
	ca       *testpki.CA
	client   testpki.Pair // a certificate every legitimate client presents
	root     *clientv3.Client
}

const (
	rootPassword    = "root-secret-3b7f"
	billingPassword = "billing-secret-91c2"
	reportsPassword = "reports-secret-5d0a"
)

func startSecureEtcd(t *testing.T) *secureEtcd {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA(dir, "tenure-test")
	if err != nil {
		t.Fatal(err)
	}
	srvPair, err := ca.Server("etcd-server")
	if err != nil {
		t.Fatal(err)
	}
	cliPair, err := ca.Client("client", "client")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := etcdembed.StartSecure(t.TempDir(), etcdembed.SecureOptions{
		CertFile: srvPair.CertFile, KeyFile: srvPair.KeyFile, TrustedCAFile: ca.CertFile,
		ClientCertAuth: true, RootPassword: rootPassword,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	s := &secureEtcd{endpoint: srv.Endpoint, ca: ca, client: cliPair}
	s.root = s.dial(t, "root", rootPassword)
	ctx := ctxT(t, 30*time.Second)
	// The commands of docs/security.md, through the client API:
	//   etcdctl role add tenure-billing
	//   etcdctl role grant-permission tenure-billing --prefix=true readwrite billing/
	//   etcdctl user add billing
	//   etcdctl user grant-role billing tenure-billing
	for _, svc := range []struct{ name, password string }{{"billing", billingPassword}, {"reports", reportsPassword}} {
		role := "tenure-" + svc.name
		if _, err := s.root.RoleAdd(ctx, role); err != nil {
			t.Fatal(err)
		}
		p := svc.name + "/"
		if _, err := s.root.RoleGrantPermission(ctx, role, p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.root.UserAdd(ctx, svc.name, svc.password); err != nil {
			t.Fatal(err)
		}
		if _, err := s.root.UserGrantRole(ctx, svc.name, role); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// config is a client configuration with the test CA and client
// certificate, and user (none when empty).
func (s *secureEtcd) config(t testing.TB, user, password string) clientv3.Config {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	sec := etcdelect.Security{CAFile: s.ca.CertFile, CertFile: s.client.CertFile, KeyFile: s.client.KeyFile, Username: user, Password: password}
	if err := sec.Apply(&cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (s *secureEtcd) dial(t testing.TB, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(s.config(t, user, password))
	if err != nil {
		t.Fatalf("etcd client as %q: %v", user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// keys lists every key under prefix, as root sees them.
func (s *secureEtcd) keys(t *testing.T, prefix string) []string {
	t.Helper()
	resp, err := s.root.Get(ctxT(t, 10*time.Second), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

func (s *secureEtcd) leases(t *testing.T) int {
	t.Helper()
	resp, err := s.root.Leases(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

func leaseOf(t *testing.T, entry string) clientv3.LeaseID {
	t.Helper()
	id, err := strconv.ParseInt(entry[strings.LastIndexByte(entry, '/')+1:], 16, 64)
	if err != nil {
		t.Fatalf("entry %q: %v", entry, err)
	}
	return clientv3.LeaseID(id)
}

// TestSecurity_EtcdRoleOnOwnPrefixElectsAndLocks: a user whose role grants
// readwrite on its service's prefix only (docs/security.md) can run
// elections, observe and take Mutexes on keys under that prefix, over TLS
// with a client certificate.
func TestSecurity_EtcdRoleOnOwnPrefixElectsAndLocks(t *testing.T) {
	s := startSecureEtcd(t)
	ctx := ctxT(t, 60*time.Second)
	const key = "billing/leader"
	cfg := election.Config{Key: key, TTL: 2 * time.Second}
	newElector := func(id string) *election.Elector {
		c := cfg
		c.Identity = id
		e, err := election.New(etcdelect.New(s.dial(t, "billing", billingPassword)), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close(context.Background()) })
		return e
	}
	a, b := newElector("a"), newElector("b")
	ta, err := a.Campaign(ctx)
	if err != nil {
		t.Fatalf("Campaign with the service's role: %v", err)
	}
	got := make(chan tenure.Term, 1)
	go func() {
		tb, err := b.Campaign(ctx)
		if err != nil {
			t.Errorf("second Campaign: %v", err)
		}
		got <- tb
	}()
	waitPos(t, b, 1)
	// An observer with the same role sees the leader.
	obs := newElector("observer")
	if l, err := obs.Leader(ctx); err != nil || l.Term.Identity != "a" || l.Term.Token != ta.Token {
		t.Fatalf("Leader = %+v, %v; want a at %d", l, err, ta.Token)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	tb := <-got
	if tb.Token <= ta.Token {
		t.Fatalf("b's token %d not above a's %d", tb.Token, ta.Token)
	}
	// A Mutex under the same prefix.
	mcfg := election.Config{Key: "billing/invoices", TTL: 2 * time.Second}
	m1, err := election.NewMutex(etcdelect.New(s.dial(t, "billing", billingPassword)), mcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m1.Close(context.Background())
	m2, err := election.NewMutex(etcdelect.New(s.dial(t, "billing", billingPassword)), mcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close(context.Background())
	if _, err := m1.Lock(ctx); err != nil {
		t.Fatalf("Mutex.Lock with the service's role: %v", err)
	}
	if _, err := m2.TryLock(ctx); !errors.Is(err, tenure.ErrLocked) {
		t.Fatalf("TryLock while held = %v, want ErrLocked", err)
	}
	if err := m1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if err := m2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if left := s.keys(t, "billing/"); len(left) != 0 {
		t.Fatalf("keys left after every resign and unlock: %v", left)
	}
}

// TestSecurity_EtcdOtherRoleCannotStealOrBreakLeadership: a client with
// valid credentials whose role covers another prefix, a client whose
// certificate names no user, a client without TLS and a client that does
// not trust the server's CA can neither read, create nor delete the
// election's keys, nor revoke or renew the leader's lease; tenure campaigns
// with the wrong role fail at once with ErrInvalidConfig and leave nothing
// behind; the leader never notices.
func TestSecurity_EtcdOtherRoleCannotStealOrBreakLeadership(t *testing.T) {
	s := startSecureEtcd(t)
	ctx := ctxT(t, 60*time.Second)
	const key = "billing/leader"
	leader, err := election.New(etcdelect.New(s.dial(t, "billing", billingPassword)), election.Config{Key: key, Identity: "leader", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close(context.Background())
	term, err := leader.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leasesBefore := s.leases(t)

	mallory := s.dial(t, "reports", reportsPassword)
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s with another service's role = %v, want permission denied", what, err)
		}
	}
	_, err = mallory.Get(ctx, key+"/", clientv3.WithPrefix())
	denied("Get of the election prefix", err)
	_, err = mallory.Get(ctx, term.Entry)
	denied("Get of the leader's entry", err)
	_, err = mallory.Put(ctx, key+"/1", "mallory")
	denied("Put of an older-looking entry", err)
	_, err = mallory.Delete(ctx, term.Entry)
	denied("Delete of the leader's entry", err)
	_, err = mallory.Delete(ctx, key+"/", clientv3.WithPrefix())
	denied("Delete of the prefix", err)
	_, err = mallory.Revoke(ctx, leaseOf(t, term.Entry))
	denied("Revoke of the leader's lease", err)
	// Renewing a crashed leader's lease would block failover for good.
	_, err = mallory.KeepAliveOnce(ctx, leaseOf(t, term.Entry))
	denied("KeepAliveOnce of the leader's lease", err)
	_, err = mallory.TimeToLive(ctx, leaseOf(t, term.Entry), clientv3.WithAttachedKeys())
	denied("TimeToLive of the leader's lease", err)
	wctx, wcancel := context.WithCancel(ctx)
	wr := <-mallory.Watch(wctx, key+"/", clientv3.WithPrefix())
	wcancel()
	if wr.Err() == nil || !strings.Contains(wr.Err().Error(), "permission denied") {
		t.Errorf("Watch of the prefix = %v, want permission denied", wr.Err())
	}

	// tenure itself, with the wrong role: a clear error, at once.
	e, err := election.New(etcdelect.New(mallory), election.Config{Key: key, Identity: "mallory", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = e.Campaign(ctx)
	if !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("Campaign with the wrong role = %v, want ErrInvalidConfig: permission denied", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Campaign with the wrong role took %v: it retried a refusal", d)
	}
	if _, err := e.TryCampaign(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("TryCampaign with the wrong role = %v, want ErrInvalidConfig", err)
	}
	if _, err := e.Leader(ctx); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("Leader with the wrong role = %v, want ErrInvalidConfig", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}

	// A certificate alone (its common name is no user) gets nothing.
	certOnly := s.dial(t, "", "")
	if _, err := certOnly.Get(ctx, key+"/", clientv3.WithPrefix()); err == nil {
		t.Error("a client certificate without a user read the election keys")
	}
	if _, err := certOnly.Delete(ctx, term.Entry); err == nil {
		t.Error("a client certificate without a user deleted the leader's entry")
	}
	// A wrong password is refused.
	if bad, err := clientv3.New(s.config(t, "billing", "wrong")); err == nil {
		_, err = bad.Get(ctx, key+"/", clientv3.WithPrefix())
		bad.Close()
		if !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Errorf("Get with a wrong password = %v, want authentication failed", err)
		}
	} else if !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Errorf("client with a wrong password = %v, want authentication failed", err)
	}
	// Without TLS, or without trusting the server's CA, nothing connects.
	plain := newClient(t, s.endpoint)
	defer plain.Close()
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	if _, err := plain.Get(pctx, key+"/", clientv3.WithPrefix()); err == nil {
		t.Error("a plaintext client read the election keys of a TLS-only server")
	}
	pcancel()
	otherCA, err := testpki.NewCA(t.TempDir(), "other")
	if err != nil {
		t.Fatal(err)
	}
	ucfg := clientv3.Config{Endpoints: []string{s.endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	if err := (etcdelect.Security{CAFile: otherCA.CertFile, CertFile: s.client.CertFile, KeyFile: s.client.KeyFile, Username: "billing", Password: billingPassword}).Apply(&ucfg); err != nil {
		t.Fatal(err)
	}
	if untrusting, err := clientv3.New(ucfg); err == nil {
		uctx, ucancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = untrusting.Get(uctx, key+"/", clientv3.WithPrefix())
		ucancel()
		untrusting.Close()
		if err == nil {
			t.Error("a client that does not trust the server's CA talked to it")
		}
	}

	// The leader never noticed, and nothing of the intruders is left.
	select {
	case <-leader.Done():
		t.Fatalf("leader lost its term: %v", leader.Err())
	default:
	}
	if l, err := leader.Leader(ctx); err != nil || l.Term.Token != term.Token || l.Term.Identity != "leader" {
		t.Fatalf("Leader after the attempts = %+v, %v; want the leader at %d", l, err, term.Token)
	}
	if got := s.keys(t, key+"/"); len(got) != 1 || got[0] != term.Entry {
		t.Fatalf("keys under the election = %v, want only %s", got, term.Entry)
	}
	if got := s.keys(t, "reports/"); len(got) != 0 {
		t.Fatalf("keys under reports/ = %v", got)
	}
	if n := s.leases(t); n != leasesBefore {
		t.Fatalf("%d leases after the refused campaigns closed, %d before: a lease was left behind", n, leasesBefore)
	}
}
