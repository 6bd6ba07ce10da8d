package tenure

import "context"

// Callbacks tell the program when it leads and when it must stop. Every field
// is optional: a nil OnElected holds the term until its ctx is done, a nil
// OnHardStop exits the process (see OnHardStop), and a nil OnDemoted or
// OnLeader is skipped.
//
// Ordering: OnElected runs in its own goroutine. OnDemoted for a term runs
// only after OnElected for that term has returned, never before, and never
// concurrently with it. OnLeader calls run one at a time, in the order the
// changes were observed (skipping those a slow call missed), on a goroutine
// of their own. A panic in OnElected is recovered, logged, and treated as a
// resignation (the demotion reason wraps ErrCallbackPanic and
// ErrResigned); when the term had ended already for another reason (its
// lease, its session, its key, Close), the demotion reason wraps that
// cause and ErrCallbackPanic, not ErrResigned. A panic in OnDemoted, OnLeader or OnHardStop is recovered
// and logged at Error; it changes nothing else (the term goes on, or has
// ended already).
//
// A Callbacks is a plain value; Run takes a copy. OnElected and OnLeader run
// on goroutines of their own, OnDemoted and OnHardStop on the goroutine that
// called Run. OnLeader may run concurrently with any of the others, and
// OnHardStop runs while OnElected has not returned, so state they share
// must be synchronized.
type Callbacks struct {
	// OnElected runs when this candidate becomes leader. ctx is cancelled the
	// moment leadership can no longer be guaranteed (lease deadline, session
	// expiry, ownership loss, resignation). Do the leader's work until ctx is
	// done, then return promptly: leadership is released only after
	// OnElected returns (unless the lease itself is already gone), and if it
	// has not returned within Config.StopTimeout after ctx ended, OnHardStop
	// runs. Returning while ctx is still live resigns.
	OnElected func(ctx context.Context, term Term)
	// OnDemoted runs after OnElected has returned, with the term that ended
	// and why: ErrResigned, ErrLeaseExpired, ErrSessionExpired,
	// ErrOwnershipLost, or ErrClosed when the Elector was closed (test with
	// errors.Is).
	OnDemoted func(term Term, reason error)
	// OnLeader runs when the observed leader changes, vacancy included. The
	// latest change wins: while one call runs, later changes replace each
	// other, and the next call gets the newest, so a slow OnLeader skips
	// intermediate leaders but always ends up with the current one (see
	// election.Elector.Observe).
	OnLeader func(leader Leader)
	// OnHardStop runs when OnElected ignored its cancelled ctx for longer
	// than Config.StopTimeout. Default: log at Error and exit the process
	// with status 1, because the work may now overlap the next leader's.
	// Leadership is released after OnHardStop returns, except that a
	// Close or Resign asked once OnHardStop has begun (from OnHardStop
	// itself, or from another goroutine) releases it as soon as OnElected
	// has returned, while OnHardStop may still run: so OnHardStop may call
	// them.
	OnHardStop func(term Term)
}
