package etcdelect

import (
	"strconv"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxLeaseHex is the length of the longest lease ID in hex: a positive
// int64 has at most 16 hex digits.
const maxLeaseHex = 16

// EntryLease returns the lease ID that entry, a candidate's entry of key
// ("<key>/<lease ID in hex>", as tenure.Term.Entry holds it), names; false
// when entry is not such a name (the lease ID in lower-case hex without
// leading zeros, as concurrency.Election and tenure write it). For fences: an entry is
// its holder's only while attached to that lease.
func EntryLease(key, entry string) (clientv3.LeaseID, bool) {
	return parseEntry(key, []byte(entry))
}

// parseEntry parses name, an etcd key that starts with "<key>/", as a
// candidate's entry of key: "<key>/<lease ID>", the lease ID in lower-case
// hex without leading zeros, as concurrency.Election and tenure write it
// (fmt's %x of a positive int64). It returns false for anything else under
// the prefix: a nested key's entry ("<key>/<sub>/<lease>"), a name with
// upper-case, leading zeros or a sign, or another client's data.
func parseEntry(key string, name []byte) (clientv3.LeaseID, bool) {
	p := prefix(key)
	if len(name) <= len(p) || string(name[:len(p)]) != p {
		return 0, false
	}
	hex := name[len(p):]
	if len(hex) > maxLeaseHex || hex[0] == '0' {
		return 0, false
	}
	for _, c := range hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return 0, false
		}
	}
	id, err := strconv.ParseInt(string(hex), 16, 64)
	if err != nil || id <= 0 {
		return 0, false
	}
	return clientv3.LeaseID(id), true
}

// isEntry reports whether kv is a contender of key: its name parses as an
// entry (parseEntry) and it is attached to the lease its name says. A key
// someone put by hand under the prefix, without that lease, would never
// expire; it is not a contender and does not block the queue.
func isEntry(key string, kv *mvccpb.KeyValue) bool {
	id, ok := parseEntry(key, kv.Key)
	return ok && kv.Lease == int64(id)
}
