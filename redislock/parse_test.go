package redislock

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseValue: any value another client could store under a lock key
// parses without panicking, and what parses round-trips: the value tenure
// would write from the parts is the value read.
func FuzzParseValue(f *testing.F) {
	for _, seed := range []string{
		"0123456789abcdef0123456789abcdef 7 host-1",
		"0123456789abcdef0123456789abcdef 18446744073709551615 a b c",
		"0123456789abcdef0123456789abcdef 0 zero",
		"0123456789ABCDEF0123456789ABCDEF 1 upper",
		"short 1 x",
		"",
		" ",
		"0123456789abcdef0123456789abcdef 1",
		"not tenure's \x00\xff",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		random, token, identity, ok := parseValue(v)
		h := holderOf(v)
		if !ok {
			if !strings.HasPrefix(h, "foreign ") {
				t.Fatalf("holderOf(%q) = %q for a value tenure did not write", v, h)
			}
			return
		}
		if token == 0 || len(random) != 32 {
			t.Fatalf("parseValue(%q) accepted token %d, random %q", v, token, random)
		}
		if h != random {
			t.Fatalf("holderOf(%q) = %q, want %q", v, h, random)
		}
		// The parts write back as v, up to leading zeros in the token
		// (ParseUint reads "007" as 7): random and identity exactly.
		got := random + " " + strconv.FormatUint(token, 10) + " " + identity
		head, tail := random+" ", " "+identity
		if got != v && (len(v) < len(head)+len(tail) || !strings.HasPrefix(v, head) || !strings.HasSuffix(v, tail) ||
			strings.TrimLeft(v[len(head):len(v)-len(tail)], "0") != strconv.FormatUint(token, 10)) {
			t.Fatalf("parseValue(%q) = %q %d %q, which writes back as %q", v, random, token, identity, got)
		}
	})
}
