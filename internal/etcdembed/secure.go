package etcdembed

import (
	"context"
	"fmt"
	"net/url"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tenure-go/tenure/internal/testnet"
)

// SecureOptions configures StartSecure.
type SecureOptions struct {
	// CertFile and KeyFile are the server's certificate and key (PEM). The
	// certificate must name 127.0.0.1. Required.
	CertFile, KeyFile string
	// TrustedCAFile verifies client certificates. Required with
	// ClientCertAuth.
	TrustedCAFile string
	// ClientCertAuth makes the server refuse clients without a certificate
	// signed by TrustedCAFile. A request without a password token is then
	// made as the user named by the certificate's common name.
	ClientCertAuth bool
	// RootPassword, when not empty, creates the user root with this
	// password and the root role, and enables authentication: from then on
	// every request needs a user with a role that permits it.
	RootPassword string
}

// StartSecure runs an etcd member that serves clients over TLS only (on
// Server.Endpoint, host:port, to be dialed with a TLS client config) and,
// with o.RootPassword, with authentication enabled. Heartbeat and election
// timeout are Start's (10 ms, 100 ms).
func StartSecure(dir string, o SecureOptions) (*Server, error) {
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, fmt.Errorf("etcdembed: StartSecure needs CertFile and KeyFile")
	}
	ports, err := testnet.FreePorts(2)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "tenure-secure"
	cfg.Dir = dir
	cu := url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
	pu := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.ClientTLSInfo.CertFile = o.CertFile
	cfg.ClientTLSInfo.KeyFile = o.KeyFile
	cfg.ClientTLSInfo.TrustedCAFile = o.TrustedCAFile
	cfg.ClientTLSInfo.ClientCertAuth = o.ClientCertAuth
	cfg.BcryptCost = 4 // the minimum: tests need not resist password cracking
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after 30s")
	}
	if o.RootPassword != "" {
		if err := enableAuth(e, o.RootPassword); err != nil {
			e.Close()
			return nil, err
		}
	}
	return &Server{e: e, Endpoint: cu.Host}, nil
}

// enableAuth creates root and enables authentication through the server's
// own API (the same requests `etcdctl user add root`, `etcdctl user
// grant-role root root` and `etcdctl auth enable` send).
func enableAuth(e *embed.Etcd, rootPassword string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.Server.UserAdd(ctx, &pb.AuthUserAddRequest{Name: "root", Password: rootPassword}); err != nil {
		return fmt.Errorf("etcdembed: add root: %w", err)
	}
	if _, err := e.Server.UserGrantRole(ctx, &pb.AuthUserGrantRoleRequest{User: "root", Role: "root"}); err != nil {
		return fmt.Errorf("etcdembed: grant root: %w", err)
	}
	if _, err := e.Server.AuthEnable(ctx, &pb.AuthEnableRequest{}); err != nil {
		return fmt.Errorf("etcdembed: enable auth: %w", err)
	}
	return nil
}
