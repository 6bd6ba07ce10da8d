package etcdelect

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestParseEntry(t *testing.T) {
	cases := []struct {
		key, name string
		id        int64
		ok        bool
	}{
		{"k", "k/694d7a1b2c3d4e5f", 0x694d7a1b2c3d4e5f, true},
		{"k", "k/1", 1, true},
		{"a/b", "a/b/7fffffffffffffff", 0x7fffffffffffffff, true},
		{"k", "k/", 0, false},                     // empty suffix
		{"k", "k/0", 0, false},                    // lease 0 is "no lease"
		{"k", "k/01", 0, false},                   // leading zero: not %x
		{"k", "k/ABC", 0, false},                  // upper case: not %x
		{"k", "k/-1", 0, false},                   // sign
		{"k", "k/+1", 0, false},                   // sign
		{"k", "k/8000000000000000", 0, false},     // beyond int64
		{"k", "k/10000000000000000", 0, false},    // seventeen digits
		{"k", "k/sub/694d7a1b2c3d4e5f", 0, false}, // nested key's entry
		{"k", "k/garbage", 0, false},
		{"k", "kk/1", 0, false}, // not under the prefix
		{"k", "k", 0, false},
	}
	for _, c := range cases {
		id, ok := parseEntry(c.key, []byte(c.name))
		if int64(id) != c.id || ok != c.ok {
			t.Errorf("parseEntry(%q, %q) = %x, %v; want %x, %v", c.key, c.name, int64(id), ok, c.id, c.ok)
		}
	}
}

func TestIsEntry_NeedsTheLeaseItsNameSays(t *testing.T) {
	for _, c := range []struct {
		lease int64
		want  bool
	}{{0x2a, true}, {0, false}, {0x2b, false}} {
		kv := &mvccpb.KeyValue{Key: []byte("k/2a"), Lease: c.lease}
		if got := isEntry("k", kv); got != c.want {
			t.Errorf("isEntry(k/2a with lease %x) = %v, want %v", c.lease, got, c.want)
		}
	}
}

// FuzzParseEntry: any key under an election's prefix, another client's
// included, parses without panic; what parses is exactly what
// concurrency.Election and tenure write for that lease (entryName), and
// every entry tenure writes for a valid key and a positive lease parses back.
func FuzzParseEntry(f *testing.F) {
	for _, s := range []struct {
		key, name string
		lease     int64
	}{
		{"k", "k/694d7a1b2c3d4e5f", 0x694d7a1b2c3d4e5f},
		{"jobs", "jobs/nightly/1", 1},
		{"k", "k/", 0},
		{"k", "k/-1", -1},
		{"é/ü", "é/ü/ff", 255},
	} {
		f.Add(s.key, s.name, s.lease)
	}
	b := New(nil)
	f.Fuzz(func(t *testing.T, key, name string, lease int64) {
		id, ok := parseEntry(key, []byte(name))
		if ok {
			if id <= 0 {
				t.Fatalf("parseEntry(%q, %q) = %d: not a lease ID", key, name, id)
			}
			if want := entryName(key, id); want != name {
				t.Fatalf("parseEntry(%q, %q) accepted a name tenure would write as %q", key, name, want)
			}
		}
		if b.CheckKey(key) != nil || lease <= 0 {
			return
		}
		made := entryName(key, clientv3.LeaseID(lease))
		got, ok := parseEntry(key, []byte(made))
		if !ok || int64(got) != lease {
			t.Fatalf("parseEntry(%q, %q) = %x, %v; want %x", key, made, int64(got), ok, lease)
		}
		if !isEntry(key, &mvccpb.KeyValue{Key: []byte(made), Lease: lease}) {
			t.Fatalf("isEntry refuses tenure's own entry %q", made)
		}
		// An entry of a key nested under key is never key's.
		nested := entryName(key+"/"+fmt.Sprint(lease%7), clientv3.LeaseID(lease))
		if _, ok := parseEntry(key, []byte(nested)); ok {
			t.Fatalf("parseEntry(%q, %q): a nested key's entry taken as the key's", key, nested)
		}
	})
}
