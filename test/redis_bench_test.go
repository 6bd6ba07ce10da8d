package test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/redislock"
)

// redisEndpoint is the address of the package's redis-server.
var redisEndpoint string

// redisImpl builds contender i for key on its own client.
type redisImpl struct {
	name string
	new  func(c *redis.Client, key string, i int) (contender, error)
	// waiting, when set, reports whether n contenders wait on key as the
	// implementation waits in its steady state, read from the server
	// (as the etcd and ZooKeeper benchmarks count the queue). Without it,
	// every contender having called lock stands for it.
	waiting func(admin *redis.Client, key string, n int) (bool, error)
}

// The Redis lock implementations, each as its users would configure it for
// a lock that waits: tenure with its defaults; redsync with its defaults
// (a random 50-250 ms pause between tries) and enough tries to wait
// through a long queue; bsm/redislock, which has no default retry, with a
// 10 ms linear backoff (tighter than its documented 100 ms examples).
var redisImpls = []redisImpl{
	{name: "tenure-redis", new: newTenureRedis, waiting: tenureRedisWaiting},
	{name: "redsync", new: newRedsync},
	{name: "bsm-redislock", new: newBSM},
}

// tenureRedisWaiting: all n−1 contenders other than the holder are
// registered in "<key>:waiting" and subscribed to their session's wake-up
// channel. Until then, contenders still joining (a failed try, a new
// pub/sub connection, a second try) load the server during the timed
// handoffs (traced at 1,000 contenders: dozens of acquire scripts between
// one release and the next).
func tenureRedisWaiting(admin *redis.Client, key string, n int) (bool, error) {
	ctx := context.Background()
	w, err := admin.ZCard(ctx, key+":waiting").Result()
	if err != nil {
		return false, err
	}
	subs, err := admin.PubSubChannels(ctx, "tenure:"+key+":*").Result()
	if err != nil {
		return false, err
	}
	return int(w) == n-1 && len(subs) == n-1, nil
}

// redisTTL is every implementation's lock TTL in the benchmark: long
// enough that no lock expires during a run.
const redisTTL = 10 * time.Second

func newRedisClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: redisEndpoint, MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
}

type tenureRedis struct{ e *election.Elector }

func newTenureRedis(c *redis.Client, key string, i int) (contender, error) {
	b, err := redislock.New([]*redis.Client{c}, redislock.Options{})
	if err != nil {
		return nil, err
	}
	e, err := election.New(b, election.Config{Key: key, Identity: fmt.Sprint(i), TTL: redisTTL})
	if err != nil {
		return nil, err
	}
	return tenureRedis{e}, nil
}

func (c tenureRedis) campaign(ctx context.Context) error {
	_, err := c.e.Campaign(ctx)
	return err
}
func (c tenureRedis) resign(ctx context.Context) error { return c.e.Resign(ctx) }
func (c tenureRedis) close(ctx context.Context) error  { return c.e.Close(ctx) }

type redsyncContender struct{ m *redsync.Mutex }

func newRedsync(c *redis.Client, key string, _ int) (contender, error) {
	rs := redsync.New(redsyncgoredis.NewPool(c))
	return redsyncContender{rs.NewMutex(key, redsync.WithExpiry(redisTTL), redsync.WithTries(1<<20))}, nil
}

func (c redsyncContender) campaign(ctx context.Context) error { return c.m.LockContext(ctx) }
func (c redsyncContender) resign(ctx context.Context) error {
	_, err := c.m.UnlockContext(ctx)
	return err
}

// close unlocks: the last holder keeps the lock when the run ends.
func (c redsyncContender) close(ctx context.Context) error {
	_, _ = c.m.UnlockContext(ctx) // an error means it was not held
	return nil
}

type bsmContender struct {
	c    *bsm.Client
	key  string
	mu   sync.Mutex
	lock *bsm.Lock
}

func newBSM(c *redis.Client, key string, _ int) (contender, error) {
	return &bsmContender{c: bsm.New(c), key: key}, nil
}

func (c *bsmContender) campaign(ctx context.Context) error {
	for {
		l, err := c.c.Obtain(ctx, c.key, redisTTL, &bsm.Options{RetryStrategy: bsm.LinearBackoff(10 * time.Millisecond)})
		if errors.Is(err, bsm.ErrNotObtained) && ctx.Err() == nil {
			continue // Obtain gives up after the TTL when ctx has no deadline
		}
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.lock = l
		c.mu.Unlock()
		return nil
	}
}

func (c *bsmContender) resign(ctx context.Context) error {
	c.mu.Lock()
	l := c.lock
	c.lock = nil
	c.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Release(ctx)
}

func (c *bsmContender) close(ctx context.Context) error { return c.resign(ctx) }

// countingContender counts the contenders that have started campaigning:
// Redis keeps no queue to count.
type countingContender struct {
	contender
	once    sync.Once
	entered *atomic.Int32
}

func (c *countingContender) campaign(ctx context.Context) error {
	c.once.Do(func() { c.entered.Add(1) })
	return c.contender.campaign(ctx)
}

// BenchmarkRedisHandoff measures handoff latency on one redis-server, as
// BenchmarkHandoff does on etcd: N contenders, each on its own client,
// loop lock → release → lock; one op is one handoff, from the moment the
// holder decides to release until the next holder's lock call returns.
// tenure wakes waiters by a PUBLISH on release; redsync and bsm/redislock
// poll.
func BenchmarkRedisHandoff(b *testing.B) {
	for _, n := range contenderCounts(b) {
		interleaved(b, n, redisImpls, func(im redisImpl) string { return im.name }, func(b *testing.B, im redisImpl) { benchRedisHandoff(b, im, n) })
	}
}

func benchRedisHandoff(b *testing.B, im redisImpl, n int) {
	key := fmt.Sprintf("tenure-bench:%s:%d:%d", im.name, n, keySeq.Add(1))
	count := timedCount(b, n)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(n)*20*time.Millisecond+time.Duration(count)*time.Second)
	defer cancel()
	admin := newRedisClient()
	defer admin.Close()

	var entered atomic.Int32
	clients := make([]*redis.Client, 0, n)
	cons := make([]contender, 0, n)
	defer func() {
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				if i < len(cons) {
					cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
					if err := cons[i].close(cctx); err != nil {
						b.Errorf("close contender %d: %v", i, err)
					}
					ccancel()
				}
				clients[i].Close()
			})
		}
		wg.Wait()
		// Nothing left behind: the lock key is gone (tenure's token
		// counter, "<key>:fence", stays by design).
		if n, err := admin.Exists(context.Background(), key).Result(); err != nil || n != 0 {
			b.Errorf("lock key %s left behind (%d, %v)", key, n, err)
		}
	}()
	var mem memCost
	mem.mark(n)
	for i := range n {
		c := newRedisClient()
		clients = append(clients, c)
		con, err := im.new(c, key, i)
		if err != nil {
			b.Fatal(err)
		}
		cons = append(cons, &countingContender{contender: con, entered: &entered})
	}
	reqs := serverRequests{read: func() (float64, error) { return redisCommands(admin) }, unit: "redis-cmds/handoff", n: count,
		byKind: func() (map[string]float64, error) { return redisCommandsBy(admin) }}
	handoffLoop{
		cons:       cons,
		count:      count,
		yield:      true,
		hold:       5 * time.Millisecond,
		queuedHook: mem.measure,
		begin:      reqs.begin,
		end:        reqs.report,
		queued: func() (int, error) {
			if int(entered.Load()) < n {
				return 0, nil
			}
			if im.waiting != nil {
				if ok, err := im.waiting(admin, key, n); err != nil || !ok {
					return 0, err
				}
			}
			// Let the last ones reach their wait.
			time.Sleep(20*time.Millisecond + time.Duration(n)*100*time.Microsecond)
			return n, nil
		},
		dump: func(state []atomic.Int32) string {
			var sb strings.Builder
			v, err := admin.Get(context.Background(), key).Result()
			fmt.Fprintf(&sb, "key %s = %q (%v)\n", key, v, err)
			for i := range state {
				fmt.Fprintf(&sb, "contender %d state %d\n", i, state[i].Load())
			}
			return sb.String()
		},
	}.run(b, ctx, cancel)
}

// redisCommands returns the commands the redis-server has processed (the
// sum of INFO commandstats' calls, less the INFO calls themselves).
func redisCommands(admin *redis.Client) (float64, error) {
	by, err := redisCommandsBy(admin)
	if err != nil {
		return 0, err
	}
	var total float64
	for _, v := range by {
		total += v
	}
	return total, nil
}

// redisCommandsBy is redisCommands by command.
func redisCommandsBy(admin *redis.Client) (map[string]float64, error) {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return nil, err
	}
	by := map[string]float64{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				c, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return nil, fmt.Errorf("commandstats %q: %w", line, err)
				}
				by[strings.TrimPrefix(name, "cmdstat_")] += c
			}
		}
	}
	return by, nil
}
