package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/internal/etcdembed"
	"github.com/tenure-go/tenure/internal/testpki"
)

// secureEtcd starts an etcd that serves TLS only, requires client
// certificates, and has authentication on, with the role of
// docs/security.md for the user billing (readwrite on billing/) and for
// reports (readwrite on reports/). It returns the endpoint and the CA, and
// the client certificate pair every client presents.
func secureEtcd(t *testing.T, billingPW, reportsPW string) (string, *testpki.CA, testpki.Pair) {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA(dir, "cli-test")
	if err != nil {
		t.Fatal(err)
	}
	srvPair, err := ca.Server("server")
	if err != nil {
		t.Fatal(err)
	}
	cliPair, err := ca.Client("client", "client")
	if err != nil {
		t.Fatal(err)
	}
	const rootPW = "root-pw-cli"
	srv, err := etcdembed.StartSecure(t.TempDir(), etcdembed.SecureOptions{
		CertFile: srvPair.CertFile, KeyFile: srvPair.KeyFile, TrustedCAFile: ca.CertFile, ClientCertAuth: true, RootPassword: rootPW,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if err := (etcdelect.Security{CAFile: ca.CertFile, CertFile: cliPair.CertFile, KeyFile: cliPair.KeyFile, Username: "root", Password: rootPW}).Apply(&cfg); err != nil {
		t.Fatal(err)
	}
	root, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, u := range []struct{ name, pw string }{{"billing", billingPW}, {"reports", reportsPW}} {
		p := u.name + "/"
		if _, err := root.RoleAdd(ctx, "tenure-"+u.name); err != nil {
			t.Fatal(err)
		}
		if _, err := root.RoleGrantPermission(ctx, "tenure-"+u.name, p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
		if _, err := root.UserAdd(ctx, u.name, u.pw); err != nil {
			t.Fatal(err)
		}
		if _, err := root.UserGrantRole(ctx, u.name, "tenure-"+u.name); err != nil {
			t.Fatal(err)
		}
	}
	return srv.Endpoint, ca, cliPair
}

func secret(t *testing.T, what string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return what + "-" + hex.EncodeToString(b[:])
}

// runTenure runs tenure with extra environment and returns its stdout,
// stderr and exit status; it fails the test after 30 s.
func runTenure(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	p := tenureCmd(args...)
	p.Env = append(p.Env, env...)
	var stdout, stderr strings.Builder
	p.Stdout, p.Stderr = &stdout, &stderr
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.Process.Kill()
		<-done
		t.Fatalf("tenure %v hung; stderr: %s", args, stderr.String())
	}
	return stdout.String(), stderr.String(), p.ProcessState.ExitCode()
}

func writeSecret(t *testing.T, pw string) string {
	f := path(t.TempDir(), "password")
	if err := os.WriteFile(f, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSecurity_CLIEtcdTLSAndAuthNeverPrintsThePassword: tenure exec and
// tenure leader reach an etcd with TLS, client certificates and auth, with
// the TLS flags from TENURE_* variables and the password from
// TENURE_PASSWORD or --password-file; at debug log level, whether the
// password is right, wrong, or the role is wrong, the password never
// appears on stderr or stdout, and CMD does not inherit TENURE_PASSWORD.
func TestSecurity_CLIEtcdTLSAndAuthNeverPrintsThePassword(t *testing.T) {
	billingPW, reportsPW := secret(t, "billing"), secret(t, "reports")
	ep, ca, pair := secureEtcd(t, billingPW, reportsPW)
	tlsEnv := []string{"TENURE_CACERT=" + ca.CertFile, "TENURE_CERT=" + pair.CertFile, "TENURE_CERT_KEY=" + pair.KeyFile}
	base := []string{"--endpoints", ep, "--log-level", "debug", "--dial-timeout", "3s"}
	secrets := []string{billingPW, reportsPW}
	noSecret := func(what string, outs ...string) {
		t.Helper()
		for _, o := range outs {
			for _, s := range secrets {
				if strings.Contains(o, s) {
					t.Fatalf("%s printed a password: %q", what, o)
				}
			}
		}
	}

	// Right password from the environment: CMD runs, without it.
	env := append([]string{passwordEnv + "=" + billingPW, "TENURE_USER=billing"}, tlsEnv...)
	args := append([]string{"exec", "--key", "billing/cli"}, base...)
	out, errOut, code := runTenure(t, env, append(args, "--", "sh", "-c",
		`echo "child:${TENURE_PASSWORD-unset}:${TENURE_USER-unset}:${TENURE_CACERT-unset}:${TENURE_CERT-unset}:${TENURE_CERT_KEY-unset}:$TENURE_TERM"`)...)
	noSecret("exec", out, errOut)
	if code != 0 || !strings.HasPrefix(out, "child:unset:unset:unset:unset:unset:") {
		t.Fatalf("exec with TLS and auth from the environment: exit %d, stdout %q (want none of them in CMD's environment), stderr %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "elected") {
		t.Fatalf("stderr at debug level shows no election log, so the test proves nothing: %s", errOut)
	}
	// Right password from a file named in the environment: CMD gets
	// neither the file's path nor the user.
	pwFile := writeSecret(t, billingPW)
	out, errOut, code = runTenure(t, append([]string{"TENURE_PASSWORD_FILE=" + pwFile, "TENURE_USER=billing"}, tlsEnv...),
		append(args, "--", "sh", "-c", `echo "child:${TENURE_PASSWORD_FILE-unset}:${TENURE_USER-unset}"`)...)
	if code != 0 || strings.TrimSpace(out) != "child:unset:unset" {
		t.Fatalf("exec with TENURE_PASSWORD_FILE: exit %d, stdout %q (want neither in CMD's environment), stderr %s", code, out, errOut)
	}
	// Right password from a file, leader subcommand.
	out, errOut, code = runTenure(t, tlsEnv, append([]string{"leader", "--key", "billing/cli", "--user", "billing", "--password-file", pwFile}, base...)...)
	noSecret("leader", out, errOut)
	if code != exitVacant || strings.TrimSpace(out) != "vacant" {
		t.Fatalf("leader with --password-file: exit %d, stdout %q, stderr %s", code, out, errOut)
	}
	// Wrong password.
	wrong := secret(t, "wrong")
	secrets = append(secrets, wrong)
	_, errOut, code = runTenure(t, append([]string{passwordEnv + "=" + wrong, "TENURE_USER=billing"}, tlsEnv...), append(args, "--", "true")...)
	noSecret("exec with a wrong password", errOut)
	if code != exitUsage || !strings.Contains(errOut, "authentication failed") {
		t.Fatalf("wrong password: exit %d, stderr %s; want 2 and authentication failed", code, errOut)
	}
	// Right password, role for another prefix.
	_, errOut, code = runTenure(t, append([]string{passwordEnv + "=" + reportsPW, "TENURE_USER=reports"}, tlsEnv...), append(args, "--", "true")...)
	noSecret("exec with another role", errOut)
	if code != exitUsage || !strings.Contains(errOut, "permission denied") {
		t.Fatalf("another role: exit %d, stderr %s; want 2 and permission denied", code, errOut)
	}
	// No TLS flags: the TLS-only server is unreachable, said so.
	_, errOut, code = runTenure(t, []string{passwordEnv + "=" + billingPW}, append([]string{"exec", "--key", "billing/cli", "--user", "billing"}, append(base, "--", "true")...)...)
	noSecret("exec without TLS", errOut)
	if code != exitUsage || !strings.Contains(errOut, "cannot reach etcd") || !strings.Contains(errOut, "does it speak TLS?") {
		t.Fatalf("plaintext to a TLS server: exit %d, stderr %s", code, errOut)
	}
}

// TestSecurity_CLIZooKeeperDigestACL: with --user and a password, tenure
// exec on ZooKeeper authenticates by digest and its nodes get the creator
// ACL; another tenure exec with a wrong password cannot queue while the
// first holds (exit 2, "not authenticated"), and neither prints a password
// at debug level.
func TestSecurity_CLIZooKeeperDigestACL(t *testing.T) {
	pw, wrong := secret(t, "zk"), secret(t, "zk-wrong")
	key := "/" + testKey(t)
	dir := t.TempDir()
	holder := start(t, "exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", key, "--ttl", "2s", "--grace", "0s",
		"--user", "billing", "--password-file", writeSecret(t, pw), "--log-level", "debug",
		"--", "sh", "-c", "echo held > "+path(dir, "held")+"; sleep 30")
	waitFile(t, path(dir, "held"), 15*time.Second)
	_, errOut, code := runTenure(t, []string{passwordEnv + "=" + wrong},
		"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", key, "--ttl", "2s", "--grace", "0s",
		"--user", "billing", "--no-wait", "--log-level", "debug", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "not authenticated") {
		t.Fatalf("wrong digest password: exit %d, stderr %s; want 2 and not authenticated", code, errOut)
	}
	_ = holder.cmd.Process.Signal(syscall.SIGTERM)
	holder.wait(t, 15*time.Second)
	for _, o := range []string{errOut, holder.stderr.String()} {
		if strings.Contains(o, pw) || strings.Contains(o, wrong) {
			t.Fatalf("printed a password: %q", o)
		}
	}
	if !strings.Contains(holder.stderr.String(), "elected") {
		t.Fatalf("holder's stderr at debug level shows no election log: %s", holder.stderr.String())
	}
}

// TestSecurity_CLIBadSecurityFlags: every inconsistent security setting is
// one clear line and exit 2, before anything connects.
func TestSecurity_CLIBadSecurityFlags(t *testing.T) {
	pwFile := writeSecret(t, "x")
	empty := path(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	etcd := []string{"exec", "--endpoints", endpoint, "--key", "k"}
	zk := []string{"exec", "--backend", "zk", "--endpoints", zkEndpoint, "--key", "/k"}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"user without password", nil, append(etcd, "--user", "u"), "needs a password"},
		{"password without user", []string{passwordEnv + "=p"}, etcd, "without --user"},
		{"empty password env", []string{passwordEnv + "="}, append(etcd, "--user", "u"), "set but empty"},
		{"password twice", []string{passwordEnv + "=p"}, append(etcd, "--user", "u", "--password-file", pwFile), "use one"},
		{"missing password file", nil, append(etcd, "--user", "u", "--password-file", "/nonexistent/pw"), "--password-file /nonexistent/pw"},
		{"empty password file", nil, append(etcd, "--user", "u", "--password-file", empty), "is empty"},
		// Read whole, /dev/zero grew tenure until it died.
		{"endless password file", nil, append(etcd, "--user", "u", "--password-file", "/dev/zero"), "longer than 65536 bytes"},
		{"cert without key", nil, append(etcd, "--cert", pwFile), "--cert and --cert-key"},
		{"unreadable CA", nil, append(etcd, "--cacert", "/nonexistent/ca.pem"), "CA file"},
		{"CA file without PEM", nil, append(etcd, "--cacert", pwFile), "no PEM certificate"},
		{"zk-acl on etcd", nil, append(etcd, "--zk-acl", "creator"), "--zk-acl is for ZooKeeper"},
		{"TLS on zk", nil, append(zk, "--cacert", pwFile), "does not speak TLS"},
		{"zk creator ACL without user", nil, append(zk, "--zk-acl", "creator"), "needs --user"},
		{"unknown zk ACL", nil, append(zk, "--zk-acl", "everyone"), "want open, creator or creator-read"},
		{"colon in zk user", []string{passwordEnv + "=p"}, append(zk, "--user", "a:b"), "cannot hold ':'"},
		// Wrong endpoints: each backend pointed at the other's server.
		{"etcd at a ZooKeeper port", nil, []string{"exec", "--endpoints", zkEndpoint, "--dial-timeout", "2s", "--key", "k"}, "a TCP connection opens: is it an etcd client port, and does it speak TLS?"},
		{"zk at an etcd port", nil, []string{"exec", "--backend", "zk", "--endpoints", endpoint, "--dial-timeout", "2s", "--key", "/k"}, "cannot reach zookeeper"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			_, errOut, code := runTenure(t, c.env, append(c.args, "--", "true")...)
			if code != exitUsage || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line with %q", code, errOut, c.want)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
}

// TestSecurity_HTTPEndpointWithTLSFlagsIsRefused: etcd's client takes an
// http:// endpoint for plaintext and drops the TLS settings, credentials
// then going in clear text. With --cacert (or --cert) asking for TLS, such
// an endpoint is refused up front (exit 2, the command never runs), for
// exec and leader alike, and for any one of several endpoints.
func TestSecurity_HTTPEndpointWithTLSFlagsIsRefused(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA(dir, "http-refused")
	if err != nil {
		t.Fatal(err)
	}
	ran := path(dir, "ran")
	for _, args := range [][]string{
		{"exec", "--endpoints", "http://" + endpoint, "--cacert", ca.CertFile, "--key", testKey(t), "--", "sh", "-c", "echo ran > " + ran},
		{"leader", "--endpoints", "https://" + endpoint + ",http://" + endpoint, "--cacert", ca.CertFile, "--key", testKey(t)},
	} {
		p := tenureCmd(args...)
		var stderr strings.Builder
		p.Stderr = &stderr
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		if code := exitWithin(t, p, 15*time.Second, "tenure "+args[0]); code != exitUsage {
			t.Errorf("tenure %s with an http:// endpoint and --cacert exited %d, want 2; stderr: %s", args[0], code, stderr.String())
		} else if !strings.Contains(stderr.String(), "plaintext (http://)") {
			t.Errorf("tenure %s said %q, want that the endpoint is plaintext", args[0], stderr.String())
		}
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran over a plaintext connection")
	}
}
