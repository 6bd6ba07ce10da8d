package zkelect

import (
	"slices"
	"strings"
)

// seqDigits is the width of ZooKeeper's sequence suffix.
const seqDigits = 10

// lockMarker is the name part before the sequence: Curator's LOCK_NAME.
const lockMarker = "-lock-"

// protectedPrefix starts every node name tenure (and Curator) creates.
const protectedPrefix = "_c_"

// contender is one child of a key's node that takes part in the queue.
type contender struct {
	name string
	seq  int64
}

// parseSeq returns the sequence number a child name ends in. ZooKeeper
// prints the parent's 32-bit counter with "%010d": ten digits; once the
// counter has wrapped, a minus sign and ten digits ("-lock--2147483648",
// as kazoo parses them) down to -1000000000, then a minus sign and nine
// digits ("-lock--999999999", "-lock--000000001"). A minus sign counts
// only right after the lock marker (a name part ending in '-' or '_'). It
// returns false for names without such a suffix, or whose suffix has more
// digits. Wrapped (negative) sequences sort before the others, as kazoo
// sorts them (Curator compares the text after "-lock-", which orders the
// negatives differently among themselves).
//
// It runs for every child of every queue read (1,000 names per read at
// 1,000 contenders), so it reads the digits once, without strconv.
func parseSeq(name string) (int64, bool) {
	if len(name) < seqDigits {
		return 0, false
	}
	i := len(name) - seqDigits // where the suffix starts
	if name[i] == '-' {        // "-" and nine digits: -999999999 .. -1
		n, ok := digits(name[i+1:])
		if !ok || n == 0 || !afterMarker(name, i) {
			return 0, false
		}
		return -n, true
	}
	n, ok := digits(name[i:])
	if !ok {
		return 0, false
	}
	neg := false
	if i > 0 {
		switch c := name[i-1]; {
		case c >= '0' && c <= '9':
			return 0, false // more than ten digits: not a sequence suffix
		case c == '-' && afterMarker(name, i-1):
			neg = true // "...-lock--2147483648", "...__lock__-2147483648"
		}
	}
	if n > 1<<31 || (!neg && n >= 1<<31) || (neg && n < 1_000_000_000) {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

// digits returns the value of s, a string of at most ten decimal digits
// (so no overflow), or false when s holds anything else.
func digits(s string) (int64, bool) {
	var n int64
	for i := 0; i < len(s); i++ {
		d := s[i] - '0' // wraps past 9 for any byte below '0'
		if d > 9 {
			return 0, false
		}
		n = n*10 + int64(d)
	}
	return n, true
}

// afterMarker reports whether a minus sign at index i of name follows a
// lock marker (a name part ending in '-' or '_').
func afterMarker(name string, i int) bool {
	return i > 0 && (name[i-1] == '-' || name[i-1] == '_')
}

// contenders returns the children that take part in the queue, lowest
// sequence first. Children without a sequence suffix are ignored.
func contenders(children []string) []contender {
	out := make([]contender, 0, len(children))
	for _, c := range children {
		if seq, ok := parseSeq(c); ok {
			out = append(out, contender{name: c, seq: seq})
		}
	}
	slices.SortFunc(out, compareContenders)
	return out
}

// compareContenders orders contenders by sequence, then by name.
func compareContenders(a, b contender) int {
	if a.seq != b.seq {
		if a.seq < b.seq {
			return -1
		}
		return 1
	}
	return strings.Compare(a.name, b.name)
}

// position finds own among the children's contenders, in one pass and
// without sorting (a wake-up at 1,000 contenders reads 1,000 names): the
// number of contenders ahead of it and the one right before it (pred.name
// is "" when none is). found is false when own is not a contender among
// children.
func position(children []string, own string) (ahead int, pred contender, found bool) {
	ahead, pred, found, _ = scan(children, own)
	return ahead, pred, found
}

// tail is what one read of a key's children shows of the queue's end, for
// the reader's next create under that key (see predict): the highest
// sequence among the contenders, and the highest contender other than the
// reader's own node.
type tail struct {
	max    int64     // the highest sequence of the read's contenders, own node included
	other  contender // the highest contender but own ("" when none)
	others int       // the contenders but own
}

// scan is position, and the read's tail, in the same pass.
func scan(children []string, own string) (ahead int, pred contender, found bool, t tail) {
	seq, ok := parseSeq(own)
	if !ok {
		return 0, contender{}, false, tail{}
	}
	me := contender{name: own, seq: seq}
	t.max = seq
	for _, c := range children {
		if c == own {
			found = true
			continue
		}
		s, ok := parseSeq(c)
		if !ok {
			continue
		}
		o := contender{name: c, seq: s}
		t.others++
		if s > t.max {
			t.max = s
		}
		if t.other.name == "" || compareContenders(o, t.other) > 0 {
			t.other = o
		}
		if compareContenders(o, me) < 0 {
			ahead++
			if pred.name == "" || compareContenders(o, pred) > 0 {
				pred = o
			}
		}
	}
	return ahead, pred, found, t
}

// guidOf returns the uuid of a protected node name "_c_<uuid>-lock-…", or
// "" when the name is not protected.
func guidOf(name string) string {
	if !strings.HasPrefix(name, protectedPrefix) {
		return ""
	}
	rest := name[len(protectedPrefix):]
	i := strings.Index(rest, lockMarker)
	if i <= 0 {
		return ""
	}
	return rest[:i]
}
