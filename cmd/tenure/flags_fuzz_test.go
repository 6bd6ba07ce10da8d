package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

// execFlagSet registers what cmdExec registers, for FuzzExecFlags.
func execFlagSet(f *execFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	f.register(fs)
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "")
	fs.StringVar(&f.identity, "identity", "", "")
	fs.BoolVar(&f.noWait, "no-wait", false, "")
	fs.DurationVar(&f.grace, "grace", time.Second, "")
	fs.StringVar(&f.metricsAddr, "metrics-addr", "", "")
	return fs
}

// FuzzExecFlags: any command line (arguments separated by NUL) parses and
// validates without panic; every configuration tenure exec accepts is one
// election.Config.Validate accepts, leaves CMD its --grace inside the
// deadline margin, and names a key the backend accepts; errors are
// messages, one line once flattened.
func FuzzExecFlags(f *testing.F) {
	for _, s := range []string{
		"--key\x00k",
		"--key\x00k\x00--ttl\x002s\x00--grace\x000s",
		"--backend\x00zk\x00--key\x00/locks/a\x00--ttl\x003s",
		"--key\x00k\x00--ttl\x001s\x00--grace\x00900ms",
		"--key\x00k\x00--ttl\x002562047h\x00--grace\x00-1s",
		"--backend\x00zk\x00--key\x00/a\x00--user\x00u\x00--zk-acl\x00creator-read",
		"--key\x00k\x00--cert\x00c\x00--cert-key\x00k",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		var args []string
		if line != "" {
			args = strings.Split(line, "\x00")
		}
		for _, a := range args {
			// Files are read by validate; keep the fuzzer off the disk.
			if strings.Contains(a, "password-file") || strings.Contains(a, "cacert") {
				return
			}
		}
		var fl execFlags
		fs := execFlagSet(&fl)
		if _, err := parse(fs, args, io.Discard); err != nil {
			if strings.Contains(oneLine(err), "\n") {
				t.Fatalf("multi-line error %q", oneLine(err))
			}
			return
		}
		cfg, err := fl.config()
		if err != nil {
			if err.Error() == "" || strings.Contains(oneLine(err), "\n") {
				t.Fatalf("empty or multi-line error %q", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("exec accepted a config Validate refuses: %v (%+v)", err, cfg)
		}
		if cfg.DeadlineMargin < fl.grace || cfg.StopTimeout >= cfg.DeadlineMargin {
			t.Fatalf("margin %v does not cover grace %v (stop %v)", cfg.DeadlineMargin, fl.grace, cfg.StopTimeout)
		}
		if cfg.TTL != fl.ttl || cfg.Key != fl.key {
			t.Fatalf("config %+v does not carry --ttl %v --key %q", cfg, fl.ttl, fl.key)
		}
		if err := fl.checkTTL(cfg.TTL); err != nil {
			t.Fatalf("accepted a TTL the backend refuses: %v", err)
		}
		if fl.backend == "zookeeper" && !strings.HasPrefix(cfg.Key, "/") {
			t.Fatalf("accepted a relative znode path %q", cfg.Key)
		}
		if errors.Is(err, nil) && fl.sec.user == "" && fl.sec.password != "" {
			t.Fatal("a password without a user")
		}
	})
}
