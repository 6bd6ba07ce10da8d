package zkelect

import (
	"regexp"
	"testing"
)

// TestNewGUID_IsARandomUUID: the guid of a protected node has the shape of
// Curator's UUID.randomUUID (version 4, RFC 4122 variant), lower-case hex,
// and differs from one campaign to the next.
func TestNewGUID_IsARandomUUID(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for range 1000 {
		g, err := newGUID()
		if err != nil {
			t.Fatal(err)
		}
		if !shape.MatchString(g) {
			t.Fatalf("newGUID() = %q, not a version 4 UUID", g)
		}
		if seen[g] {
			t.Fatalf("newGUID() returned %q twice", g)
		}
		seen[g] = true
		if name := protectedPrefix + g + lockMarker + "0000000001"; guidOf(name) != g {
			t.Fatalf("guidOf(%q) = %q, want %q", name, guidOf(name), g)
		}
	}
}
