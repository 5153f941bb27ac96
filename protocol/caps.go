package protocol

import "fmt"

// Caps on what a target may send about a tree. They are protocol limits:
// a receiver refuses a message or a walk that goes over one with a
// *CapError, before it spends memory or time on it. They are Linux's own
// limits where Linux has one, so no tree a target can read is refused for
// its names; depth is the one cap of our choosing.
const (
	// MaxName is the most bytes of one name in an Entry: NAME_MAX.
	MaxName = 255
	// MaxPath is the most bytes of a path under the walked or listed
	// directory, and of a symlink's target: PATH_MAX.
	MaxPath = 4096
	// MaxDepth is the most directory levels under the walked or listed
	// directory. MaxPath alone allows 2048 (one-byte names); each level
	// costs the initiator a directory descriptor walk per entry below it
	// (os.Root resolves a path one element at a time), so 1024 levels
	// bound a chain's cost at about half of what MaxPath would allow, far
	// above any real tree's depth.
	MaxDepth = 1024
	// MaxBatchEntries is the most entries in one WalkBatch or files in one
	// PackReply.
	MaxBatchEntries = 1024
)

// CapError reports a value over one of the caps above. It wraps
// ErrMalformed: a peer that sends one does not follow the protocol.
type CapError struct {
	What string // "name", "path", "depth", "symlink target", "entries"
	Got  int
	Cap  int
}

func (e *CapError) Error() string {
	unit := " bytes"
	switch e.What {
	case "depth":
		unit = " levels"
	case "entries", "rules":
		unit = ""
	}
	return fmt.Sprintf("%s of %d%s, over the protocol's cap of %d%s", e.What, e.Got, unit, e.Cap, unit)
}

func (e *CapError) Unwrap() error { return ErrMalformed }
