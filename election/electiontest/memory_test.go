package electiontest

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/election"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memoryHarness runs the conformance suite against the in-memory backend.
func memoryHarness(t *testing.T) Harness {
	m := NewMemory()
	t.Cleanup(m.Close)
	return Harness{
		TTL:           600 * time.Millisecond,
		FailoverSlack: 100 * time.Millisecond,
		NewBackend:    func(testing.TB) election.Backend { return m.Client() },
		Crash:         func(_ testing.TB, b election.Backend) { b.(*Client).Crash() },
		CutOff:        func(_ testing.TB, b election.Backend) func() { return b.(*Client).CutOff() },
		ExpireSession: func(t testing.TB, key, id string) {
			if !m.ExpireSession(key, id) {
				t.Fatalf("no session of %s on %s", id, key)
			}
		},
		DeleteEntry: func(t testing.TB, term tenure.Term) {
			if !m.DeleteEntry(term.Key, term.Token) {
				t.Fatalf("no entry %d on %s", term.Token, term.Key)
			}
		},
	}
}

func TestConformance_Memory(t *testing.T) { Run(t, memoryHarness(t)) }

// TestMemory_OpenSessionRefusesBadOptions: a session without a renewal
// interval (or a TTL) is refused, as the real backends refuse it. Its
// keep-alive panicked on a zero interval before, killing the process.
func TestMemory_OpenSessionRefusesBadOptions(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	for _, opts := range []election.SessionOptions{
		{TTL: time.Second},
		{TTL: time.Second, RenewInterval: time.Second},
		{RenewInterval: time.Millisecond},
	} {
		if s, err := m.Client().OpenSession(context.Background(), opts); !errors.Is(err, tenure.ErrInvalidConfig) {
			if s != nil {
				s.Close(context.Background())
			}
			t.Errorf("OpenSession(%+v) = %v, want ErrInvalidConfig", opts, err)
		}
	}
}
