package election

import "time"

// Clock is the local clock the Elector reads for lease deadlines. Times it
// returns must carry a monotonic reading (time.Now's do), so that deadlines
// survive wall-clock jumps. Timers are armed with durations computed from
// it. Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current local time.
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
