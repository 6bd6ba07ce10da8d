package zkelect

import (
	"context"
	"fmt"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
)

// authCred is one AddAuth the connection sends after its session is
// established and again, by go-zookeeper, after every reconnection.
type authCred struct {
	scheme string
	auth   []byte
}

// WithDigestAuth authenticates the connection as user with ZooKeeper's
// digest scheme, and makes the default ACL of the nodes tenure creates
// CreatorACL(false): all permissions for the connections authenticated as
// user, none for anyone else. WithACL or WithCreatorACL set another ACL.
// Default: no authentication (and the world-open ACL, as before).
//
// Digest authentication sends user:password to the server in clear text
// over the client connection; see docs/security.md. The password is never
// logged or put in an error.
func WithDigestAuth(user, password string) Option {
	return func(o *options) {
		o.digestUser = user
		o.auth = append(o.auth, authCred{scheme: "digest", auth: []byte(user + ":" + password)})
	}
}

// WithCreatorACL sets the ACL of every node tenure creates (the key's
// node, its missing ancestors and the candidates' nodes) to all permissions
// for the identities the connection authenticated as (ZooKeeper's "auth"
// scheme), and, with worldRead, read permission for everyone, so that
// observers without credentials can see who leads (`tenure leader`,
// Elector.Leader and Observe). It needs WithDigestAuth: Dial refuses it
// without. Default: see WithDigestAuth.
func WithCreatorACL(worldRead bool) Option {
	return func(o *options) {
		o.acl = CreatorACL(worldRead)
		o.aclSet = true
		o.creatorACL = true
	}
}

// CreatorACL is the ACL WithCreatorACL sets: zk.PermAll for the creator's
// authenticated identities and, with worldRead, zk.PermRead for
// world:anyone.
func CreatorACL(worldRead bool) []zk.ACL {
	acl := zk.AuthACL(zk.PermAll)
	if worldRead {
		acl = append(acl, zk.WorldACL(zk.PermRead)...)
	}
	return acl
}

// finish applies the defaults that depend on other options and checks
// them.
func (o *options) finish() error {
	if o.digestUser != "" || len(o.auth) > 0 {
		for _, a := range o.auth {
			user, _, _ := strings.Cut(string(a.auth), ":")
			if user == "" {
				return fmt.Errorf("%w: zookeeper: digest authentication with an empty user name", tenure.ErrInvalidConfig)
			}
		}
		if !o.aclSet {
			o.acl = CreatorACL(false)
		}
	}
	if o.creatorACL && len(o.auth) == 0 {
		return fmt.Errorf("%w: zookeeper: WithCreatorACL needs WithDigestAuth: the server refuses an ACL for the creator of an unauthenticated connection", tenure.ErrInvalidConfig)
	}
	if len(o.acl) == 0 {
		return fmt.Errorf("%w: zookeeper: empty ACL", tenure.ErrInvalidConfig)
	}
	return nil
}

// authenticate sends the connection's credentials. go-zookeeper sends them
// again after every reconnection, before any other request.
func (b *Backend) authenticate(ctx context.Context, creds []authCred) error {
	for _, c := range creds {
		_, err := call(ctx, b, func() (struct{}, error) {
			return struct{}{}, b.conn.AddAuth(c.scheme, c.auth)
		}, nil)
		if err != nil {
			return translate("add "+c.scheme+" auth", err)
		}
	}
	return nil
}

// OpenACL is the default ACL without WithDigestAuth: every permission for
// world:anyone, so anyone who can reach the servers may delete the nodes.
func OpenACL() []zk.ACL { return zk.WorldACL(zk.PermAll) }
