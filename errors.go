package tenure

import "errors"

// Sentinel errors. Backends translate their own failures into these, so
// callers test with errors.Is and never depend on a backend's error types.
// Errors returned by tenure wrap one of these with %w where it applies and
// keep the cause (the backend's error, or ctx.Err()) reachable too.
var (
	// ErrNotLeader is returned by operations that need leadership when this
	// candidate does not lead.
	ErrNotLeader = errors.New("tenure: not leader")
	// ErrSessionExpired means the backend session (etcd lease, ZooKeeper
	// session) is gone: everything held under it is lost.
	ErrSessionExpired = errors.New("tenure: session expired")
	// ErrLeaseExpired means the local lease deadline passed without an
	// acknowledged renewal: the leader demoted itself before the server could
	// expire its session.
	ErrLeaseExpired = errors.New("tenure: lease deadline passed")
	// ErrOwnershipLost means the candidate's key disappeared or changed hands
	// while the session lived (for example someone deleted it by hand).
	ErrOwnershipLost = errors.New("tenure: ownership lost")
	// ErrResigned is the demotion reason when leadership was given up on
	// purpose: Resign, the elected work returning, or Run's ctx ending.
	ErrResigned = errors.New("tenure: resigned")
	// ErrLocked is returned by non-blocking acquisitions when another
	// candidate holds the key.
	ErrLocked = errors.New("tenure: held by another candidate")
	// ErrCanceled is joined with ctx.Err() when a blocking call returns
	// because its context ended.
	ErrCanceled = errors.New("tenure: canceled")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("tenure: closed")
	// ErrInvalidConfig wraps every configuration or argument error.
	ErrInvalidConfig = errors.New("tenure: invalid configuration")
	// ErrUnavailable means the backend could not be reached or did not
	// answer in time.
	ErrUnavailable = errors.New("tenure: backend unavailable")
	// ErrCallbackPanic is the demotion reason (joined with ErrResigned) when
	// a callback panicked.
	ErrCallbackPanic = errors.New("tenure: callback panicked")
)
