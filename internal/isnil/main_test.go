package isnil

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks for leaked goroutines, as every package's tests do.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
