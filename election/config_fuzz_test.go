package election_test

import (
	"errors"
	"math/big"
	"testing"
	"time"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

// FuzzConfigValidate: Validate never panics, its errors wrap
// ErrInvalidConfig, and every Config it accepts keeps the failover bound's
// inequalities (computed without overflow): 0 < 2·RenewInterval < TTL,
// DeadlineMargin + 2·RenewInterval ≤ TTL, 0 < StopTimeout < DeadlineMargin.
func FuzzConfigValidate(f *testing.F) {
	s := int64(time.Second)
	f.Add("k", "i", 10*s, int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Add("k", "i", 9*s, 3*s, 2*s, s, s, s)
	f.Add("", "", int64(-1), int64(-1), int64(-1), int64(-1), int64(-1), int64(-1))
	f.Add("k", "i", int64(1<<63-1), int64(1<<62+1), int64(1), int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, key, id string, ttl, renew, margin, stop, retry, cleanup int64) {
		c := election.Config{
			Key: key, Identity: id, TTL: time.Duration(ttl), RenewInterval: time.Duration(renew),
			DeadlineMargin: time.Duration(margin), StopTimeout: time.Duration(stop),
			RetryInterval: time.Duration(retry), CleanupTimeout: time.Duration(cleanup),
		}.WithDefaults()
		err := c.Validate()
		if err != nil {
			if !errors.Is(err, tenure.ErrInvalidConfig) {
				t.Fatalf("Validate = %v, not ErrInvalidConfig", err)
			}
			return
		}
		b := func(d time.Duration) *big.Int { return big.NewInt(int64(d)) }
		two := big.NewInt(2)
		twoRenew := new(big.Int).Mul(two, b(c.RenewInterval))
		switch {
		case c.Key == "" || c.Identity == "":
			t.Fatalf("accepted an empty key or identity: %+v", c)
		case c.RenewInterval <= 0 || twoRenew.Cmp(b(c.TTL)) >= 0:
			t.Fatalf("accepted RenewInterval %v with TTL %v", c.RenewInterval, c.TTL)
		case c.DeadlineMargin <= 0 || new(big.Int).Add(twoRenew, b(c.DeadlineMargin)).Cmp(b(c.TTL)) > 0:
			t.Fatalf("accepted DeadlineMargin %v + 2×%v with TTL %v", c.DeadlineMargin, c.RenewInterval, c.TTL)
		case c.StopTimeout <= 0 || c.StopTimeout >= c.DeadlineMargin:
			t.Fatalf("accepted StopTimeout %v with DeadlineMargin %v", c.StopTimeout, c.DeadlineMargin)
		case c.RetryInterval <= 0 || c.CleanupTimeout <= 0:
			t.Fatalf("accepted RetryInterval %v, CleanupTimeout %v", c.RetryInterval, c.CleanupTimeout)
		}
	})
}
