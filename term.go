package tenure

import (
	"fmt"
	"time"
)

// Term is one tenure of one leader over one key. Its Token is the fencing
// token: pass it to the protected resource with every write and let the
// resource refuse tokens lower than the highest it has seen.
//
// A Term is a value; it is safe to copy and to share between goroutines.
type Term struct {
	// Token is the fencing token. On etcd it is the create revision of the
	// leader's key; on ZooKeeper the czxid (creation zxid) of the leader's
	// node; on Redis the value the key's counter "<key>:fence" took when the
	// lock was acquired (with several masters, the largest among those that
	// granted it), which is advisory (see Advisory). It is never zero for a
	// real term; an observer on Redis sees 0 when the key holds a value
	// tenure did not write.
	Token uint64
	// Key is the election key (the name users gave, not the backend's
	// internal key).
	Key string
	// Identity is the leader's identity as it announced itself.
	Identity string
	// Backend names the backend that issued the term ("etcd", "zookeeper",
	// "redis", "memory").
	Backend string
	// Entry is the backend's own name for the leader's entry (etcd key,
	// znode path; on Redis the random part of the lock's value), which
	// backend-side fences compare against. The etcd, ZooKeeper and Redis
	// backends report it to observers too; it is empty when the backend
	// does not (the in-memory backend).
	Entry string
	// Advisory is true when the term comes from a backend that is not
	// linearizable (Redis): its Token orders terms only as long as that
	// backend keeps its data, and can go back after a failover to a replica
	// that missed a write. An advisory term avoids duplicate work; it does
	// not fence. Verifiers that must fence (fence.Require, pgfence's
	// DoTerm, etcdfence, zkfence) refuse it.
	Advisory bool
	// Since is the local time at which this process learned of the term. It
	// is meaningful only on the machine that set it; never compare it with
	// another machine's clock. It is set on the terms a campaign returns and
	// zero in an observer's view (Leader), which the backends report
	// without it.
	Since time.Time
}

// IsZero reports whether t has no token: the zero Term (no term), or an
// observer's view of a Redis key held by a value tenure did not write.
func (t Term) IsZero() bool { return t.Token == 0 }

// String formats the term for logs: "key#token(identity)".
func (t Term) String() string {
	return fmt.Sprintf("%s#%d(%s)", t.Key, t.Token, t.Identity)
}

// Leader is what an observer of a key sees: either the current leader's term
// or a vacancy. The zero Leader is neither (Vacant is false, Term is zero):
// it stands for no observation.
//
// A Leader is a value; it is safe to copy and to share between goroutines.
type Leader struct {
	// Key is the election key that was observed.
	Key string
	// Vacant is true when nobody holds the key.
	Vacant bool
	// Term is the holder's term; zero when Vacant.
	Term Term
}

// String formats the leader for logs.
func (l Leader) String() string {
	if l.Vacant {
		return l.Key + ": vacant"
	}
	return l.Term.String()
}
