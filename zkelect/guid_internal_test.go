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

// TestNextGUID_AChainOfUUIDs: a session's guids on a key after its first
// follow each other (nextGUID), so that a client that saw one node can
// name the next; each has the same UUID shape, none repeats along the
// chain, and the chain is the same wherever (and by whichever version) it
// is computed.
func TestNextGUID_AChainOfUUIDs(t *testing.T) {
	shape := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	g, err := newGUID()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{g: true}
	for range 10000 {
		n := nextGUID(g)
		if n != nextGUID(g) {
			t.Fatalf("nextGUID(%q) differs from one call to the next", g)
		}
		if !shape.MatchString(n) {
			t.Fatalf("nextGUID(%q) = %q, not a version 4 UUID", g, n)
		}
		if seen[n] {
			t.Fatalf("nextGUID returned %q twice along one chain", n)
		}
		seen[n] = true
		g = n
	}
	// Fixed across versions: a tenure of another version on the same lock
	// path names this one's next node the same way (computed apart, with
	// Python's hashlib: the SHA-256 of the text, its first 16 bytes, the
	// version and variant bits set).
	if got, want := nextGUID("00000000-0000-4000-8000-000000000000"), "db8055e0-e030-4d5a-816b-ec4dc338d698"; got != want {
		t.Fatalf("nextGUID of the zero UUID = %q, want %q", got, want)
	}
}
