// Package zkfence fences writes to ZooKeeper: a Multi that commits only
// while the holder's node still exists with its version (0: tenure never
// changes its nodes). Node names are sequential and never reused, so a node
// that still exists is still the holder's, and still the lowest, with one
// exception: after 2³¹ creates under one key ZooKeeper's sequence counter
// wraps, and a newcomer sorts before the holder (docs/zookeeper.md). Both
// then hold until the old holder releases, and this fence passes the old
// holder's writes; a fence that compares tokens (fence.Guard, pgfence)
// refuses them.
package zkfence

import (
	"errors"
	"fmt"
	"math"
	"path"

	"github.com/go-zookeeper/zk"

	"github.com/tenure-go/tenure"
	"github.com/tenure-go/tenure/fence"
)

// Fence guards ZooKeeper writes. It is a plain value, safe for concurrent
// use (a *zk.Conn is).
type Fence struct {
	// Conn is the connection the writes go through. Required: there is no
	// default.
	Conn *zk.Conn
	// Metrics, when set, counts refusals (verifier "zookeeper"). Default:
	// nil, counts nothing.
	Metrics *fence.Metrics
}

// isEntry reports whether entry is a contender's node of key: a child of
// key whose name ends in a 10-character sequence, ten digits or, once
// ZooKeeper's counter has wrapped, a minus and nine (not the key's own
// node, nor another key's).
func isEntry(key, entry string) bool {
	if key == "" || entry == "" || path.Dir(entry) != key {
		return false
	}
	name := path.Base(entry)
	if len(name) < 10 {
		return false
	}
	seq := name[len(name)-10:]
	if seq[0] == '-' { // after the counter wrapped: %010d of a negative number
		seq = seq[1:]
	}
	for _, c := range seq {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Multi runs ops (zk.CreateRequest, zk.SetDataRequest, zk.DeleteRequest,
// ...) atomically with a check that term's node exists at version 0, and
// returns a *fence.StaleError when it does not (a node whose data someone
// changed is refused too). term must come from a ZooKeeper election
// (Term.Backend "zookeeper", Term.Entry a node of Term.Key, Term.Token at
// most math.MaxInt64); any other term, an advisory Redis term included,
// is refused with an error wrapping tenure.ErrInvalidConfig.
func (f Fence) Multi(term tenure.Term, ops ...any) ([]zk.MultiResponse, error) {
	if f.Conn == nil {
		return nil, fmt.Errorf("%w: zkfence: no Conn", tenure.ErrInvalidConfig)
	}
	if term.Token == 0 || term.Token > math.MaxInt64 || term.Backend != "zookeeper" || !isEntry(term.Key, term.Entry) {
		return nil, fmt.Errorf("%w: zkfence: term %v is not a ZooKeeper holder's", tenure.ErrInvalidConfig, term)
	}
	all := append([]any{&zk.CheckVersionRequest{Path: term.Entry, Version: 0}}, ops...)
	resp, err := f.Conn.Multi(all...)
	if len(resp) > 0 && (errors.Is(resp[0].Error, zk.ErrNoNode) || errors.Is(resp[0].Error, zk.ErrBadVersion)) {
		f.Metrics.Rejected(term.Key, "zookeeper")
		return resp, &fence.StaleError{Resource: term.Key, Token: term.Token}
	}
	return resp, err
}
