package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/redislock"
)

// openRedis connects to the Redis masters of --endpoints (one: a plain
// lock; several: Redlock) with --user, the password and TLS from
// --cacert/--cert/--cert-key, and checks that a quorum answers within the
// dial timeout.
func (c *common) openRedis(ctx context.Context) (election.Backend, func(), error) {
	eps, err := c.endpointList()
	if err != nil {
		return nil, nil, err
	}
	o := &redis.Options{
		Username:    c.sec.user,
		Password:    c.sec.password,
		DialTimeout: c.dialTimeout,
		// Fail fast and let the watchdog's next round retry: a command
		// retried inside the client would hide a dead link from the lease.
		MaxRetries:               -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if o.TLSConfig, err = c.sec.redisTLS(); err != nil {
		return nil, nil, err
	}
	// go-redis prints pool failures on stderr by itself, a second line
	// beside tenure's own; they come back to tenure as errors anyway.
	redis.SetLogger(quietRedis{})
	dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	// Keep trying until the dial timeout, as etcd's and ZooKeeper's clients
	// do: a refused connection fails at once, but a server that is starting
	// answers a moment later.
	b, err := redislock.Dial(dctx, eps, o, redislock.Options{})
	for errors.Is(err, tenure.ErrUnavailable) && dctx.Err() == nil {
		select {
		case <-dctx.Done():
		case <-time.After(200 * time.Millisecond):
			unavailable := err
			if b, err = redislock.Dial(dctx, eps, o, redislock.Options{}); err != nil && dctx.Err() != nil {
				err = unavailable // the try the deadline cut short says less
			}
		}
	}
	if ctx.Err() != nil { // the caller (a signal) ended the tries, not the timeout
		if err == nil {
			b.Close()
		}
		return nil, nil, ctx.Err()
	}
	if err != nil {
		if errors.Is(err, tenure.ErrUnavailable) {
			return nil, nil, fmt.Errorf("cannot reach redis at %s within %v: %w", c.endpoints.list, c.dialTimeout, err)
		}
		return nil, nil, err
	}
	return b, func() { b.Close() }, nil
}

// redisTLS builds the TLS configuration for Redis from --cacert, --cert and
// --cert-key, as for etcd; nil (plain TCP) when none is set.
func (s *security) redisTLS() (*tls.Config, error) {
	return etcdelect.Security{CAFile: s.caCert, CertFile: s.cert, KeyFile: s.certKey}.TLSConfig()
}

// quietRedis drops go-redis's own log lines (its logger is process-wide).
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
