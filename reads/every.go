package reads

import "time"

// ProgressInterval is how often transfers report progress.
const ProgressInterval = 100 * time.Millisecond

// Every is the progress throttle every transfer uses: Due is true at
// most once per ProgressInterval (or Interval, if set). The zero value is
// ready, and first due one interval after its first call.
type Every struct {
	Interval time.Duration
	last     time.Time
}

// Due reports whether an interval has passed since it last said so.
func (e *Every) Due() bool {
	now := time.Now()
	if e.last.IsZero() {
		e.last = now
		return false
	}
	iv := e.Interval
	if iv <= 0 {
		iv = ProgressInterval
	}
	if now.Sub(e.last) < iv {
		return false
	}
	e.last = now
	return true
}
