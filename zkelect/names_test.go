package zkelect

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// parseSeqReference is parseSeq as it was until 2026-12-01, with strconv:
// FuzzParseSeq checks that the one-pass parseSeq agrees with it on every
// input, and BenchmarkPosition compares the two.
func parseSeqReference(name string) (int64, bool) {
	if len(name) < seqDigits {
		return 0, false
	}
	digitsOnly := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
		return true
	}
	// afterMarker reports whether a minus sign at index i follows a lock
	// marker.
	afterMarker := func(i int) bool {
		return i > 0 && (name[i-1] == '-' || name[i-1] == '_')
	}
	tail := name[len(name)-seqDigits:]
	if tail[0] == '-' { // "-" and nine digits: -999999999 .. -1
		if !digitsOnly(tail[1:]) || !afterMarker(len(name)-seqDigits) {
			return 0, false
		}
		n, err := strconv.ParseInt(tail[1:], 10, 64)
		if err != nil || n == 0 {
			return 0, false
		}
		return -n, true
	}
	if !digitsOnly(tail) {
		return 0, false
	}
	neg := false
	if len(name) > seqDigits {
		switch c := name[len(name)-seqDigits-1]; {
		case c >= '0' && c <= '9':
			return 0, false // more than ten digits: not a sequence suffix
		case c == '-' && afterMarker(len(name)-seqDigits-1):
			neg = true // "...-lock--2147483648", "...__lock__-2147483648"
		}
	}
	n, err := strconv.ParseInt(tail, 10, 64)
	if err != nil || n > 1<<31 || (!neg && n >= 1<<31) || (neg && n < 1_000_000_000) {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

func TestParseSeq(t *testing.T) {
	cases := []struct {
		name string
		seq  int64
		ok   bool
	}{
		{"_c_8c1a-lock-0000000042", 42, true},
		{"f4989fab__lock__0000000000", 0, true},
		{"0000000007", 7, true},
		{"x-lock-2147483647", 2147483647, true},
		{"x-lock--2147483648", -2147483648, true}, // the counter wrapped
		{"x-lock--1000000001", -1000000001, true},
		{"k__lock__-2147483600", -2147483600, true},
		{"x-lock--999999999", -999999999, true}, // nine digits after the sign
		{"x-lock--000000005", -5, true},
		{"k__lock__-000000001", -1, true},
		{"x-lock--000000000", 0, false},  // ZooKeeper prints 0 as ten zeros
		{"x-lock--0999999999", 0, false}, // ten digits after the sign, above -1000000000
		{"x-lock5-000000005", 0, false},  // no lock marker before the sign
		{"-000000005", 0, false},
		{"x-lock-00000000042", 0, false}, // eleven digits
		{"x-lock-000000042", 0, false},   // nine digits
		{"x-lock-00000000a1", 0, false},
		{"lock", 0, false},
		{"", 0, false},
		{"x-lock-9999999999", 0, false}, // beyond ZooKeeper's int32
	}
	for _, c := range cases {
		seq, ok := parseSeq(c.name)
		if seq != c.seq || ok != c.ok {
			t.Errorf("parseSeq(%q) = %d, %v; want %d, %v", c.name, seq, ok, c.seq, c.ok)
		}
	}
}

func TestContenders_OrderAcrossPrefixesAndWrap(t *testing.T) {
	got := contenders([]string{
		"_c_b-lock-0000000003", "abc__lock__0000000001", "sub", "_c_a-lock-0000000002",
		"_c_w-lock--2147483647", "_c_v-lock--2147483648", "readme.txt",
	})
	var names []string
	for _, c := range got {
		names = append(names, c.name)
	}
	want := []string{"_c_v-lock--2147483648", "_c_w-lock--2147483647", "abc__lock__0000000001", "_c_a-lock-0000000002", "_c_b-lock-0000000003"}
	if !slices.Equal(names, want) {
		t.Fatalf("contenders = %v, want %v", names, want)
	}
}

func TestGUIDOf(t *testing.T) {
	if g := guidOf("_c_0f1e2d3c-aaaa-4bbb-8ccc-0123456789ab-lock-0000000001"); g != "0f1e2d3c-aaaa-4bbb-8ccc-0123456789ab" {
		t.Fatalf("guidOf = %q", g)
	}
	for _, n := range []string{"abc__lock__0000000001", "_c_-lock-0000000001", "_c_nolock"} {
		if g := guidOf(n); g != "" {
			t.Errorf("guidOf(%q) = %q, want empty", n, g)
		}
	}
}

// FuzzParseSeq: any child name, another client's included, parses without
// panic, and every name ZooKeeper itself would make parses back.
func FuzzParseSeq(f *testing.F) {
	for _, s := range []string{"_c_x-lock-0000000001", "a__lock__0000000000", "x-lock--2147483648", "", "-", "0000000000", "--0000000001"} {
		f.Add(s, int32(0))
	}
	f.Fuzz(func(t *testing.T, name string, n int32) {
		s, ok := parseSeq(name)
		if rs, rok := parseSeqReference(name); s != rs || ok != rok {
			t.Fatalf("parseSeq(%q) = %d, %v; the reference says %d, %v", name, s, ok, rs, rok)
		}
		guidOf(name)
		contenders([]string{name})
		position([]string{name, "_c_x-lock-0000000001"}, name)
		made := fmt.Sprintf("%s-lock-%010d", strings.TrimRight(name, "0123456789-_"), n) // as ZooKeeper prints it
		seq, ok := parseSeq(made)
		if !ok || seq != int64(n) {
			t.Fatalf("parseSeq(%q) = %d, %v; want %d", made, seq, ok, n)
		}
	})
}

// TestPosition_AgreesWithTheSortedQueue: position's one-pass answer (how
// many contenders are ahead, the one right before) is what the sorted list
// says, for every member of random queues with other prefixes, wrapped
// sequences, duplicates of a sequence and names that are not contenders.
func TestPosition_AgreesWithTheSortedQueue(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	prefixes := []string{"_c_a-lock-", "_c_b-lock-", "k__lock__", "x-lock-"}
	for round := range 500 {
		var children []string
		seen := map[string]bool{}
		for range 1 + r.IntN(40) {
			var name string
			switch r.IntN(10) {
			case 0:
				name = fmt.Sprintf("other-%d", r.IntN(1000)) // not a contender
			case 1:
				name = fmt.Sprintf("%s-%010d", prefixes[r.IntN(len(prefixes))], 2147483648-r.IntN(50)) // wrapped
			default:
				name = fmt.Sprintf("%s%010d", prefixes[r.IntN(len(prefixes))], r.IntN(60))
			}
			if !seen[name] {
				seen[name] = true
				children = append(children, name)
			}
		}
		sorted := contenders(children)
		for i, c := range sorted {
			ahead, pred, found := position(children, c.name)
			want := ""
			if i > 0 {
				want = sorted[i-1].name
			}
			if !found || ahead != i || pred.name != want {
				t.Fatalf("round %d: position(%v, %q) = %d, %q, %v; the sorted queue %v says %d, %q", round, children, c.name, ahead, pred.name, found, sorted, i, want)
			}
		}
		if _, _, found := position(children, "_c_gone-lock-0000000070"); found {
			t.Fatalf("round %d: a name not among the children was found", round)
		}
	}
}

// BenchmarkParseSeq parses the names of a queue of 1,000 contenders, as
// every queue read at 1,000 contenders does (position), with the one-pass
// parseSeq and with the strconv reference it replaced, side by side. ns/op
// is per name.
func BenchmarkParseSeq(b *testing.B) {
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("_c_%032x-lock-%010d", i*7919, 123456+i)
	}
	for _, impl := range []struct {
		name  string
		parse func(string) (int64, bool)
	}{{"onepass", parseSeq}, {"strconv", parseSeqReference}} {
		b.Run("impl="+impl.name, func(b *testing.B) {
			var sum int64
			for i := 0; b.Loop(); i++ {
				n, ok := impl.parse(names[i%len(names)])
				if !ok {
					b.Fatal("not a sequence")
				}
				sum += n
			}
			if sum == 0 {
				b.Fatal("nothing parsed")
			}
		})
	}
}
