package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
)

// Config is one manager's configuration, read from a YAML file (see
// LoadConfig and the README for an example). Every member of a cluster
// lists the same Members and DCS; Name says which member this one is.
//
// A Config is a plain value, safe to copy.
type Config struct {
	// Name is this member's name: its identity in the election, its entry in
	// Members and its PostgreSQL cluster_name. Required.
	Name string `yaml:"name"`
	// Scope names the cluster. The leader key is /patroni-like/<scope>/leader
	// and the bootstrap key /patroni-like/<scope>/initialize. Default:
	// "patroni-like".
	Scope string `yaml:"scope"`
	// DCS is the distributed configuration store the election runs on.
	DCS DCSConfig `yaml:"dcs"`
	// PostgreSQL describes the local PostgreSQL instance.
	PostgreSQL PostgreSQLConfig `yaml:"postgresql"`
	// Members lists every member of the cluster, this one included: where
	// its REST API and its PostgreSQL listen. At least one; names and
	// addresses unique.
	Members []Member `yaml:"members"`
}

// DCSConfig holds the election's settings.
type DCSConfig struct {
	// Backend is the store: "etcd" (the only one this example supports).
	// Default: "etcd".
	Backend string `yaml:"backend"`
	// Endpoints are the store's client addresses (host:port). Required.
	Endpoints []string `yaml:"endpoints"`
	// TTL is the leader lease's time to live: a crashed primary's manager
	// keeps the leader key this long (Patroni's ttl). Whole seconds, at least
	// 1s. Default: 10s.
	TTL time.Duration `yaml:"ttl"`
	// LoopWait is the pause between two passes of the manager's loop, which
	// points standbys at the current primary and rejoins demoted nodes
	// (Patroni's loop_wait). Below TTL/2. Default: 1s.
	LoopWait time.Duration `yaml:"loop_wait"`
	// MaximumLagOnFailover is how many bytes of WAL a standby may lack,
	// behind the position the primary last recorded (OptimeKey, every
	// loop_wait), and still be promoted when the primary is gone
	// (Patroni's maximum_lag_on_failover). A standby further behind
	// yields its term: no primary rather than one that lost more than
	// this. Default (and 0): 1 MiB (1048576), Patroni's default; 1 allows
	// next to no lag.
	MaximumLagOnFailover int64 `yaml:"maximum_lag_on_failover"`
}

// PostgreSQLConfig describes the local PostgreSQL instance.
type PostgreSQLConfig struct {
	// DataDir is the instance's data directory; the manager creates it
	// (initdb or pg_basebackup) when it is missing or empty. It replaces
	// only a directory it made (marked by DataDir + ".managed") or a
	// PostgreSQL data directory; it refuses one holding other files.
	// Required. Relative paths are relative to the configuration file.
	DataDir string `yaml:"data_dir"`
	// BinDir holds initdb, postgres, pg_basebackup, pg_rewind and
	// pg_controldata. Default: the newest /usr/lib/postgresql/<v>/bin.
	// Relative paths are relative to the configuration file.
	BinDir string `yaml:"bin_dir"`
	// RunAs is the OS user PostgreSQL runs as when the manager runs as root
	// (PostgreSQL refuses to run as root). Default: "postgres".
	RunAs string `yaml:"run_as"`
	// Parameters are extra postgresql.conf settings (name: value), written
	// after the manager's own. Optional.
	Parameters map[string]string `yaml:"parameters"`
}

// Member is one member of the cluster.
type Member struct {
	// Name is the member's name. Required.
	Name string `yaml:"name"`
	// API is where its REST API listens (host:port). Required.
	API string `yaml:"api"`
	// Postgres is where its PostgreSQL listens (host:port, host an IP
	// address). Required.
	Postgres string `yaml:"postgres"`
}

// Defaults of Config fields left empty.
const (
	// DefaultScope is Config.Scope's default.
	DefaultScope = "patroni-like"
	// DefaultTTL is DCSConfig.TTL's default, Patroni's ttl default too.
	DefaultTTL = 10 * time.Second
	// DefaultLoopWait is DCSConfig.LoopWait's default.
	DefaultLoopWait = time.Second
	// DefaultMaximumLagOnFailover is DCSConfig.MaximumLagOnFailover's
	// default, in bytes of WAL.
	DefaultMaximumLagOnFailover = 1 << 20
	// DefaultRunAs is PostgreSQLConfig.RunAs's default.
	DefaultRunAs = "postgres"
)

// ConfigError lists everything wrong with a configuration file.
type ConfigError struct {
	// File is the configuration file's path ("" when read from elsewhere).
	File string
	// Problems are the individual findings, in file order where possible.
	Problems []error
}

func (e *ConfigError) Error() string {
	var b bytes.Buffer
	if e.File != "" {
		fmt.Fprintf(&b, "config %s: ", e.File)
	} else {
		b.WriteString("config: ")
	}
	if len(e.Problems) == 1 {
		b.WriteString(e.Problems[0].Error())
		return b.String()
	}
	fmt.Fprintf(&b, "%d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n  - ")
		b.WriteString(p.Error())
	}
	return b.String()
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (e *ConfigError) Unwrap() []error { return e.Problems }

// LoadConfig reads, defaults and validates the YAML configuration at path.
// Unknown keys are errors. Every failure is a *ConfigError.
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, &ConfigError{File: path, Problems: []error{err}}
	}
	defer f.Close()
	cfg, err := ParseConfig(f, filepath.Dir(path))
	var ce *ConfigError
	if errors.As(err, &ce) {
		ce.File = path
	}
	return cfg, err
}

// ParseConfig decodes YAML from r, applies defaults, makes a relative
// data_dir or bin_dir absolute, relative to baseDir (itself relative to
// the working directory), and validates. Every failure is a
// *ConfigError.
func ParseConfig(r io.Reader, baseDir string) (Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	// A type error (an unknown key, a value of the wrong type) leaves the
	// rest decoded: report it with the rest's problems, all at once.
	var problems []error
	if err := dec.Decode(&cfg); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			if errors.Is(err, io.EOF) {
				err = errors.New("the file is empty")
			}
			return Config{}, &ConfigError{Problems: []error{err}}
		}
		for _, e := range te.Errors {
			problems = append(problems, errors.New(e))
		}
	}
	cfg = cfg.withDefaults()
	// Absolute paths: PostgreSQL's programs run in "/" (command), so a
	// relative one would name a directory there.
	for _, p := range []*string{&cfg.PostgreSQL.DataDir, &cfg.PostgreSQL.BinDir} {
		if *p == "" || filepath.IsAbs(*p) {
			continue
		}
		abs, err := filepath.Abs(filepath.Join(baseDir, *p))
		if err != nil {
			problems = append(problems, fmt.Errorf("postgresql path %q: %w", *p, err))
			continue
		}
		*p = abs
	}
	if err := cfg.Validate(); err != nil {
		var ce *ConfigError
		if !errors.As(err, &ce) {
			return Config{}, err
		}
		problems = append(problems, ce.Problems...)
	}
	if len(problems) > 0 {
		return Config{}, &ConfigError{Problems: problems}
	}
	return cfg, nil
}

func (c Config) withDefaults() Config {
	if c.Scope == "" {
		c.Scope = DefaultScope
	}
	if c.DCS.Backend == "" {
		c.DCS.Backend = "etcd"
	}
	if c.DCS.TTL == 0 {
		c.DCS.TTL = DefaultTTL
	}
	if c.DCS.LoopWait == 0 {
		c.DCS.LoopWait = DefaultLoopWait
	}
	if c.DCS.MaximumLagOnFailover == 0 {
		c.DCS.MaximumLagOnFailover = DefaultMaximumLagOnFailover
	}
	if c.PostgreSQL.RunAs == "" {
		c.PostgreSQL.RunAs = DefaultRunAs
	}
	return c
}

var (
	nameRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	scopeRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	paramRE = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)
)

// Validate reports every problem of c (defaults applied) in one
// *ConfigError, or returns nil.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	switch {
	case c.Name == "":
		bad("name is required")
	case !nameRE.MatchString(c.Name):
		bad("name %q: use lower-case letters, digits, '-' and '_' (it becomes PostgreSQL's cluster_name and the application_name of replication)", c.Name)
	}
	if !scopeRE.MatchString(c.Scope) {
		bad("scope %q: use letters, digits, '.', '-' and '_'", c.Scope)
	}
	switch c.DCS.Backend {
	case "etcd":
	case "redis":
		bad("dcs.backend %q: Redis is efficiency-only (its tokens can go back after a failover and two holders can overlap), and a primary must be unique: use etcd", c.DCS.Backend)
	case "zookeeper", "zk":
		bad("dcs.backend %q: this example runs on etcd only (tenure's zkelect backend works for the election, but the example's bootstrap key is written with etcd's API)", c.DCS.Backend)
	default:
		bad("dcs.backend %q: want \"etcd\"", c.DCS.Backend)
	}
	if len(c.DCS.Endpoints) == 0 {
		bad("dcs.endpoints: at least one endpoint (host:port) is required")
	}
	for i, ep := range c.DCS.Endpoints {
		if err := checkHostPort(ep); err != nil {
			bad("dcs.endpoints[%d] %q: %v", i, ep, err)
		}
	}
	switch ttl := c.DCS.TTL; {
	case ttl < time.Second:
		bad("dcs.ttl %v: at least 1s", ttl)
	case ttl%time.Second != 0:
		bad("dcs.ttl %v: etcd leases take whole seconds", ttl)
	}
	if c.DCS.MaximumLagOnFailover < 0 {
		bad("dcs.maximum_lag_on_failover %d: bytes of WAL, not negative", c.DCS.MaximumLagOnFailover)
	}
	switch lw := c.DCS.LoopWait; {
	case lw <= 0:
		bad("dcs.loop_wait %v: must be positive", lw)
	case c.DCS.TTL >= time.Second && 2*lw >= c.DCS.TTL:
		bad("dcs.loop_wait %v: must be below ttl/2 (%v), or a standby would notice a new primary too late", lw, c.DCS.TTL/2)
	}
	if c.PostgreSQL.DataDir == "" {
		bad("postgresql.data_dir is required")
	}
	if c.PostgreSQL.BinDir != "" {
		if fi, err := os.Stat(c.PostgreSQL.BinDir); err != nil || !fi.IsDir() {
			bad("postgresql.bin_dir %q is not a directory", c.PostgreSQL.BinDir)
		}
	}
	for k := range c.PostgreSQL.Parameters {
		if !paramRE.MatchString(k) {
			bad("postgresql.parameters: %q is not a parameter name", k)
		}
	}
	if len(c.Members) == 0 {
		bad("members: list every member of the cluster (name, api, postgres), this one included")
	}
	names, addrs := map[string]bool{}, map[string]string{}
	for i, m := range c.Members {
		where := fmt.Sprintf("members[%d]", i)
		if m.Name == "" {
			bad("%s: name is required", where)
		} else if names[m.Name] {
			bad("%s: name %q appears twice", where, m.Name)
		}
		names[m.Name] = true
		for _, a := range []struct{ field, v string }{{"api", m.API}, {"postgres", m.Postgres}} {
			if a.v == "" {
				bad("%s (%s): %s is required", where, m.Name, a.field)
				continue
			}
			if err := checkHostPort(a.v); err != nil {
				bad("%s (%s): %s %q: %v", where, m.Name, a.field, a.v, err)
				continue
			}
			if other, dup := addrs[a.v]; dup {
				bad("%s (%s): %s %q is also %s", where, m.Name, a.field, a.v, other)
			}
			addrs[a.v] = m.Name + "'s " + a.field
		}
		if m.Postgres != "" {
			if h, _, err := net.SplitHostPort(m.Postgres); err == nil && net.ParseIP(h) == nil {
				bad("%s (%s): postgres %q: the host must be an IP address (PostgreSQL listens on it)", where, m.Name, m.Postgres)
			}
		}
	}
	if c.Name != "" && len(c.Members) > 0 && !names[c.Name] {
		bad("name %q is not among members", c.Name)
	}
	if len(errs) == 0 {
		return nil
	}
	return &ConfigError{Problems: errs}
}

func checkHostPort(s string) error {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("want host:port")
	}
	if h == "" {
		return errors.New("the host is empty")
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not in 1-65535", p)
	}
	return nil
}

// Self returns this member's entry in Members.
func (c Config) Self() Member {
	for _, m := range c.Members {
		if m.Name == c.Name {
			return m
		}
	}
	return Member{}
}

// Member returns the member called name, and whether there is one.
func (c Config) Member(name string) (Member, bool) {
	for _, m := range c.Members {
		if m.Name == name {
			return m, true
		}
	}
	return Member{}, false
}

// LeaderKey is the election key: /patroni-like/<scope>/leader.
func (c Config) LeaderKey() string { return "/patroni-like/" + c.Scope + "/leader" }

// InitializeKey is the key the first member to bootstrap the cluster
// claims: /patroni-like/<scope>/initialize.
func (c Config) InitializeKey() string { return "/patroni-like/" + c.Scope + "/initialize" }

// LastPrimaryKey names the member promoted last:
// /patroni-like/<scope>/last-primary. A former primary that finds its own
// name there has been followed by no other primary, so its data has not
// diverged from anyone's: it need not wait for one to rewind onto.
func (c Config) LastPrimaryKey() string { return "/patroni-like/" + c.Scope + "/last-primary" }

// OptimeKey holds the WAL position the primary recorded last, every
// loop_wait while it is open for writes (Patroni's /optime/leader):
// /patroni-like/<scope>/optime. A candidate further behind it than
// dcs.maximum_lag_on_failover is not promoted.
func (c Config) OptimeKey() string { return "/patroni-like/" + c.Scope + "/optime" }

// Marshal returns c as YAML.
func (c Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }
