package redislock_test

import (
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tenure-go/tenure/election"
	"github.com/tenure-go/tenure/election/electiontest"
)

// TestElectedLogCarriesTheToken: Redis issues the token when the key is
// taken, after the campaign's entry was made; the "elected" log line must
// carry the term's token, not the entry's 0.
func TestElectedLogCarriesTheToken(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	core, logs := observer.New(zapcore.InfoLevel)
	b := newTestHarness().newBackend(t)
	e, err := election.New(b, election.Config{Key: electiontest.Key(t), Identity: "a", TTL: time.Second}, election.WithLogger(zap.New(core)))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	term, err := e.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	elected := logs.FilterMessage("elected").All()
	if len(elected) != 1 {
		t.Fatalf("%d \"elected\" log entries, want 1", len(elected))
	}
	if got := elected[0].ContextMap()["token"]; got != term.Token {
		t.Fatalf("\"elected\" logged token %v, want the term's %d", got, term.Token)
	}
}
