package election_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfig_Defaults(t *testing.T) {
	c := election.Config{Key: "k"}.WithDefaults()
	if c.TTL != election.DefaultTTL || c.RenewInterval != c.TTL/3 || c.DeadlineMargin != c.TTL/5 ||
		c.StopTimeout != c.DeadlineMargin/2 || c.RetryInterval != c.TTL/10 || c.CleanupTimeout != c.TTL || c.Identity == "" {
		t.Fatalf("defaults = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 30 * time.Second, 300 * time.Millisecond} {
		if err := (election.Config{Key: "k", TTL: ttl}).WithDefaults().Validate(); err != nil {
			t.Errorf("defaults for TTL %v do not validate: %v", ttl, err)
		}
	}
}

func TestConfig_ValidateRefusesBrokenBounds(t *testing.T) {
	base := election.Config{Key: "k", Identity: "i", TTL: 9 * time.Second}.WithDefaults()
	cases := []struct {
		name string
		mod  func(*election.Config)
		want string
	}{
		{"empty key", func(c *election.Config) { c.Key = "" }, "Key is empty"},
		{"negative TTL", func(c *election.Config) { c.TTL = -time.Second }, "TTL"},
		{"renew at TTL/2", func(c *election.Config) { c.RenewInterval = c.TTL / 2 }, "below TTL/2"},
		{"negative renew", func(c *election.Config) { c.RenewInterval = -1 }, "RenewInterval"},
		{"margin eats the renewals", func(c *election.Config) { c.DeadlineMargin = c.TTL / 2 }, "exceeds TTL"},
		{"margin ≥ TTL", func(c *election.Config) { c.DeadlineMargin = c.TTL }, "exceeds TTL"},
		{"stop timeout ≥ margin", func(c *election.Config) { c.StopTimeout = c.DeadlineMargin }, "below DeadlineMargin"},
		{"negative retry", func(c *election.Config) { c.RetryInterval = -1 }, "RetryInterval"},
		{"negative cleanup", func(c *election.Config) { c.CleanupTimeout = -1 }, "CleanupTimeout"},
	}
	for _, c := range cases {
		cfg := base
		c.mod(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, tenure.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig mentioning %q", c.name, err, c.want)
		}
	}
}

func TestNew_RefusesBadInput(t *testing.T) {
	m := electiontest.NewMemory()
	defer m.Close()
	if _, err := election.New(nil, election.Config{Key: "k"}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("nil backend: %v", err)
	}
	var none *electiontest.Client
	if _, err := election.New(none, election.Config{Key: "k"}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("a nil *electiontest.Client: %v", err)
	}
	if _, err := election.New(m.Client(), election.Config{}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := election.New(m.Client(), election.Config{Key: "k", TTL: time.Second, RenewInterval: 2 * time.Second}); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("renew above TTL: %v", err)
	}
}
