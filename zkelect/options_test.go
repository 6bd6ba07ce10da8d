package zkelect_test

import (
	"context"
	"testing"
	"time"

	"github.com/tenure-go/tenure/election/electiontest"
	"github.com/tenure-go/tenure/zkelect"
)

// TestWithLogger_NilKeepsTheDefault: WithLogger(nil) is the default logger,
// as election.WithLogger(nil) is, not a nil one that panics on the first
// message. go-zookeeper logs as it connects, and the backend as it
// campaigns and resigns.
func TestWithLogger_NilKeepsTheDefault(t *testing.T) {
	b := dialWith(t, zkelect.WithLogger(nil))
	e := newZKElector(t, b, electiontest.Key(t), "a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if term.Token == 0 {
		t.Fatal("elected with token 0")
	}
	if err := e.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
