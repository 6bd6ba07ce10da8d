package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/etcdelect"
	"github.com/tenure-go/tenure/redislock"
	"github.com/tenure-go/tenure/zkelect"
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
// messages that are not empty once flattened to one line.
func FuzzExecFlags(f *testing.F) {
	for _, s := range []string{
		"--key\x00k",
		"--key\x00k\x00--ttl\x002s\x00--grace\x000s",
		"--backend\x00zk\x00--key\x00/locks/a\x00--ttl\x003s",
		"--key\x00k\x00--ttl\x001s\x00--grace\x00900ms",
		"--key\x00k\x00--ttl\x002562047h\x00--grace\x00-1s",
		"--backend\x00zk\x00--key\x00/a\x00--user\x00u\x00--zk-acl\x00creator-read",
		"--key\x00k\x00--cert\x00c\x00--cert-key\x00k",
		"--key\x00a\nb",
		"--backend\x00zk\x00--key\x00/zookeeper/x",
		"--backend\x00redis\x00--key\x00a b",
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
		// oneLine (how the CLI prints errors) never leaves a newline, so the
		// property to hold is that something is left to print.
		if _, err := parse(fs, args, io.Discard); err != nil {
			if oneLine(err) == "" {
				t.Fatalf("empty error message %q", err.Error())
			}
			return
		}
		cfg, err := fl.config()
		if err != nil {
			if oneLine(err) == "" {
				t.Fatalf("empty error message %q", err.Error())
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
		var keyErr error
		switch fl.backend {
		case "etcd":
			keyErr = etcdelect.CheckKey(cfg.Key)
		case "redis":
			keyErr = redislock.CheckKey(cfg.Key)
		case "zookeeper":
			keyErr = zkelect.CheckKey(cfg.Key)
		default:
			t.Fatalf("accepted backend %q", fl.backend)
		}
		if keyErr != nil {
			t.Fatalf("accepted a key the %s backend refuses: %v", fl.backend, keyErr)
		}
		if fl.sec.user == "" && fl.sec.password != "" {
			t.Fatal("a password without a user")
		}
	})
}
