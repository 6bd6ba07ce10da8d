package zkfence_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run when a test leaves a goroutine behind
// (a go-zookeeper connection not closed, say).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
