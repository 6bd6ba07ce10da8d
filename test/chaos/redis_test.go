package chaos

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tenure-go/tenure/internal/redisserver"
	"github.com/tenure-go/tenure/redislock"
)

// ---- Redis: one redis-server, efficiency only ----
//
// The Redis lock is not linearizable (docs/redis.md): its row is run and
// reported apart. It has no server-side session to expire and no
// server-side leader: those scenarios are skipped. A full restart loses
// every key (persistence is off), so the lock is free at once while the
// old holder still believes it holds, until its watchdog finds the key
// gone: that overlap is what "efficiency only" means, and it is counted.

type redisServers struct {
	s     *redisserver.Server
	admin *redis.Client
}

func startRedis(dir string) (servers, error) {
	s, err := redisserver.Start(filepath.Join(dir, "redis"), redisserver.Options{})
	if err != nil {
		return nil, err
	}
	admin := redis.NewClient(redisOptions(s.Addr()))
	return &redisServers{s: s, admin: admin}, nil
}

func redisOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr: addr, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

func dialRedis(ctx context.Context, endpoints []string) (*redislock.Backend, error) {
	o := redisOptions("")
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return redislock.Dial(dctx, endpoints, o, redislock.Options{})
}

func (s *redisServers) Endpoints() []string { return []string{s.s.Addr()} }

// ExpiryGranularity: a waiter wakes when the holder's key would expire
// (it reads its remaining TTL), and Redis expires it on access.
func (s *redisServers) ExpiryGranularity() time.Duration { return 100 * time.Millisecond }

func (s *redisServers) ServerFailover() time.Duration { return time.Second }

func (s *redisServers) KillLeader() (func() error, error) { return nil, errUnsupported }

func (s *redisServers) RestartAll() error {
	s.s.Kill()
	return s.s.Restart()
}

func (s *redisServers) Expire(*termInfo) error { return errUnsupported }

func (s *redisServers) Isolate([]int64) (int, int, func() error, error) {
	return 0, 0, nil, errUnsupported
}

// Entries counts the lock key and the waiting entries (the token counter,
// "<key>:fence", stays by design).
func (s *redisServers) Entries(key string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := s.admin.Exists(ctx, key).Result()
	if err != nil {
		return 0, err
	}
	w, err := s.admin.ZCard(ctx, key+":waiting").Result()
	if err != nil {
		return 0, err
	}
	return int(n + w), nil
}

// Holder: the token in the lock key's value ("<random> <token> <identity>").
func (s *redisServers) Holder(key string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.admin.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	f := strings.Fields(v)
	if len(f) < 2 {
		return 0, fmt.Errorf("chaos: lock value %q is not tenure's", v)
	}
	return strconv.ParseUint(f[1], 10, 64)
}

func (s *redisServers) LeaderChanges() float64 { return 0 }

func (s *redisServers) Diagnose(key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := s.admin.Get(ctx, key).Result()
	pttl, _ := s.admin.PTTL(ctx, key).Result()
	w, _ := s.admin.ZRangeWithScores(ctx, key+":waiting", 0, -1).Result()
	var b strings.Builder
	fmt.Fprintf(&b, "redis %s = %q (%v), pttl %v; waiting:", key, v, err, pttl)
	for _, z := range w {
		fmt.Fprintf(&b, "\n  %v until %.0f", z.Member, z.Score)
	}
	return b.String()
}

func (s *redisServers) Close() {
	s.admin.Close()
	s.s.Close()
}
