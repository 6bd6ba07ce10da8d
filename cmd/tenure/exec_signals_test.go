package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tenure-go/tenure/election"
)

// TestExec_MissingCommandIsReportedBeforeTheCampaign: a command that
// cannot be found fails at once with 127, without waiting for KEY (held
// here), and --no-wait reports it too instead of exiting 0 because KEY is
// held (a typo on N cron replicas would otherwise never show).
func TestExec_MissingCommandIsReportedBeforeTheCampaign(t *testing.T) {
	v := env{"etcd", endpoint}
	key := v.key(t)
	holder, err := election.New(v.electionBackend(t, 5*time.Second), election.Config{Key: key, Identity: "holder", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Campaign(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, mode := range [][]string{{"--no-wait"}, nil} {
		args := append(append([]string{"exec"}, v.flags("")...), "--key", key)
		args = append(append(args, mode...), "--", "/nonexistent/bakup.sh")
		began := time.Now()
		p := start(t, args...)
		code := p.wait(t, 15*time.Second)
		took := time.Since(began)
		if code != exitCannotRun {
			t.Fatalf("exec %v of a missing command, KEY held: exit %d, want %d; stderr: %s", mode, code, exitCannotRun, p.stderr)
		}
		if took > 3*time.Second {
			t.Fatalf("exec %v of a missing command took %v: it waited for KEY", mode, took)
		}
		if !strings.Contains(p.stderr.String(), "cannot run /nonexistent/bakup.sh") {
			t.Fatalf("stderr %q does not name the command", p.stderr)
		}
	}
	// Neither queued: only the holder's entry is there.
	if n := v.queued(t, key); n != 1 {
		t.Fatalf("%d entries under the key, want the holder's 1", n)
	}
}
