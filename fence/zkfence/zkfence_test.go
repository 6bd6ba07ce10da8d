package zkfence_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/fence/zkfence"
)

// TestMulti_NoConnIsAConfigError: a Fence without a Conn refuses, with
// ErrInvalidConfig, instead of a nil pointer panic.
func TestMulti_NoConnIsAConfigError(t *testing.T) {
	term := tenure.Term{Key: "/k", Entry: "/k/_c_x-lock-0000000001", Token: 5, Backend: "zookeeper"}
	if _, err := (zkfence.Fence{}).Multi(term); !errors.Is(err, tenure.ErrInvalidConfig) {
		t.Fatalf("Multi without a Conn = %v, want ErrInvalidConfig", err)
	}
}

// TestMulti_TermsNoElectionIssuedAreConfigErrors: zkfence checks only that
// the term's node exists at version 0, so the term must name a contender's
// node of its key, with a token a czxid can be. Before, only a non-empty
// Entry was required: the key's own node (version 0 for good), another
// key's node, or a token above math.MaxInt64 went through.
func TestMulti_TermsNoElectionIssuedAreConfigErrors(t *testing.T) {
	// A node after the sequence counter wrapped is a contender's: the
	// term is not refused as bad input (it goes on to the Multi, here on
	// a Conn that cannot send, which fails otherwise).
	wrapped := tenure.Term{Key: "/k", Entry: "/k/_c_x-lock--000000001", Token: 5, Backend: "zookeeper"}
	if _, err := (zkfence.Fence{Conn: closedConn(t)}).Multi(wrapped); errors.Is(err, tenure.ErrInvalidConfig) {
		t.Errorf("a node named after the counter wrapped: %v, want it taken for a contender's", err)
	}
	f := zkfence.Fence{Conn: &zk.Conn{}} // never reached: the term is refused first
	good := tenure.Term{Key: "/k", Entry: "/k/_c_x-lock-0000000001", Token: 5, Backend: "zookeeper"}
	for name, mod := range map[string]func(*tenure.Term){
		"the key's own node":       func(t *tenure.Term) { t.Entry = "/k" },
		"another key's node":       func(t *tenure.Term) { t.Key = "/other" },
		"a node without sequence":  func(t *tenure.Term) { t.Entry = "/k/config" },
		"a token above MaxInt64":   func(t *tenure.Term) { t.Token = math.MaxInt64 + 1 },
		"no entry":                 func(t *tenure.Term) { t.Entry = "" },
		"an advisory (Redis) term": func(t *tenure.Term) { t.Backend, t.Advisory = "redis", true },
	} {
		term := good
		mod(&term)
		if _, err := f.Multi(term); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("%s (%+v): %v, want ErrInvalidConfig", name, term, err)
		}
	}
}

// closedConn returns a go-zookeeper connection that was closed: its
// requests fail at once.
func closedConn(t *testing.T) *zk.Conn {
	t.Helper()
	c, _, err := zk.Connect([]string{"127.0.0.1:1"}, time.Second, zk.WithLogger(zk.DefaultLogger))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	return c
}
