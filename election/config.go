package election

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unicode/utf8"

	"github.com/tenure-go/tenure"
)

// Default values of Config fields left zero.
const (
	// DefaultTTL is the session TTL when Config.TTL is zero.
	DefaultTTL = 10 * time.Second
)

// Config holds the tunables of an Elector. The zero value of every field but
// Key selects its documented default. A Config is a plain value: copy it
// freely; the Elector keeps its own copy.
type Config struct {
	// Key is the election key. Required, valid UTF-8. Backends may
	// restrict its form further (Backend.CheckKey).
	Key string
	// Identity names this candidate to observers. Default: "hostname-pid".
	Identity string
	// TTL is the session's time to live on the server: how long a crashed
	// leader keeps its key. Default: DefaultTTL (10 s). The backend may
	// restrict it (Backend.CheckTTL); etcd wants whole seconds.
	TTL time.Duration
	// RenewInterval is how often the session is renewed. Default: TTL/3.
	// Must be below TTL/2 and leave room for DeadlineMargin:
	// DeadlineMargin + 2·RenewInterval ≤ TTL, so that one failed renewal
	// does not demote a healthy leader.
	RenewInterval time.Duration
	// DeadlineMargin is how long before the server could expire the lease
	// the leader demotes itself when renewals stop being acknowledged: the
	// room for clock-rate error and for the elected work to stop. Default:
	// TTL/5, or less when RenewInterval leaves no room for it.
	DeadlineMargin time.Duration
	// StopTimeout is how long the elected work may run after its context
	// was cancelled before OnHardStop runs. Default: DeadlineMargin/2. Must
	// be below DeadlineMargin, so that work that stops within StopTimeout
	// has stopped before the server can elect another leader.
	StopTimeout time.Duration
	// RetryInterval is the pause between campaigns that failed for a
	// transient reason (backend unavailable) in Run and Observe. Default:
	// TTL/10, at least 50 ms.
	RetryInterval time.Duration
	// CleanupTimeout bounds the fresh context on which entries are removed
	// after a failed or cancelled campaign and on which Run resigns.
	// Default: TTL.
	CleanupTimeout time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
// It does not validate.
func (c Config) WithDefaults() Config {
	if c.Identity == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		c.Identity = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.DeadlineMargin == 0 {
		c.DeadlineMargin = min(c.TTL/5, c.TTL-2*c.RenewInterval)
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = c.DeadlineMargin / 2
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = max(c.TTL/10, 50*time.Millisecond)
	}
	if c.CleanupTimeout == 0 {
		c.CleanupTimeout = c.TTL
	}
	return c
}

// Validate reports every inconsistency of c (after defaults are applied, as
// New does) in one error wrapping tenure.ErrInvalidConfig. A bad value is
// refused, never adjusted.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	if c.Key == "" {
		bad("Key is empty")
	} else if !utf8.ValidString(c.Key) {
		bad("Key %q is not valid UTF-8", c.Key)
	}
	if c.Identity == "" {
		bad("Identity is empty")
	}
	if c.TTL <= 0 {
		bad("TTL %v must be positive", c.TTL)
	}
	renewOK := false
	if c.RenewInterval <= 0 {
		bad("RenewInterval %v must be positive", c.RenewInterval)
	} else if c.TTL > 0 && c.RenewInterval > (c.TTL-1)/2 { // 2·RenewInterval ≥ TTL, without overflow
		bad("RenewInterval %v must be below TTL/2 (%v)", c.RenewInterval, c.TTL/2)
	} else {
		renewOK = c.TTL > 0
	}
	if c.DeadlineMargin <= 0 {
		bad("DeadlineMargin %v must be positive", c.DeadlineMargin)
	} else if renewOK && c.DeadlineMargin > c.TTL-2*c.RenewInterval { // 2·RenewInterval < TTL here
		bad("DeadlineMargin %v + 2×RenewInterval %v exceeds TTL %v: one late renewal would demote a healthy leader",
			c.DeadlineMargin, c.RenewInterval, c.TTL)
	}
	if c.StopTimeout <= 0 {
		bad("StopTimeout %v must be positive", c.StopTimeout)
	} else if c.DeadlineMargin > 0 && c.StopTimeout >= c.DeadlineMargin {
		bad("StopTimeout %v must be below DeadlineMargin %v, or stopped work could overlap the next leader", c.StopTimeout, c.DeadlineMargin)
	}
	if c.RetryInterval <= 0 {
		bad("RetryInterval %v must be positive", c.RetryInterval)
	}
	if c.CleanupTimeout <= 0 {
		bad("CleanupTimeout %v must be positive", c.CleanupTimeout)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", tenure.ErrInvalidConfig, errors.Join(errs...))
}
