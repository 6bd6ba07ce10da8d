package zkfence_test

import (
	"errors"
	"testing"

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
