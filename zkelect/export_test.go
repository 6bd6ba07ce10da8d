package zkelect

import (
	"reflect"
	"sync"
	"unsafe"
)

// TapMisses returns how many of b's creates Enqueue had to read back
// because the tap had no record of their reply.
func TapMisses(b *Backend) uint64 { return b.tap.misses.Load() }

// DisableTap makes b's tap record nothing from now on, so that Enqueue
// reads every new node back.
func DisableTap(b *Backend) {
	b.tap.mu.Lock()
	b.tap.off = true
	b.tap.mu.Unlock()
}

// StrictAnchor reports whether b's renewals count from an older sync: its
// connection is not known to reach a single server.
func StrictAnchor(b *Backend) bool { return b.strictAnchor() }

// ServerRole names the role b's connection read for its server: "single",
// "ensemble" or "unknown".
func ServerRole(b *Backend) string {
	c := b.tap.cur.Load()
	if c == nil {
		return "unknown"
	}
	switch c.role.Load() {
	case roleSingle:
		return "single"
	case roleEnsemble:
		return "ensemble"
	}
	return "unknown"
}

// ReadsOfRole counts the connections of b whose server's role was read.
func ReadsOfRole(b *Backend) uint64 { return b.roleReads.Load() }

// WatchersOf counts the channels go-zookeeper keeps for watches on node
// p (data and exists watches) on b's connection: go-zookeeper can remove
// none before p changes.
func WatchersOf(b *Backend, p string) int {
	v := reflect.ValueOf(b.conn).Elem()
	mu := (*sync.Mutex)(unsafe.Pointer(v.FieldByName("watchersLock").UnsafeAddr()))
	mu.Lock()
	defer mu.Unlock()
	n := 0
	it := v.FieldByName("watchers").MapRange()
	for it.Next() {
		if it.Key().Field(0).String() == p {
			n += it.Value().Len()
		}
	}
	return n
}
