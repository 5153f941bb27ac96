package verbstest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/rdmacp/rdmacp/verbs"
)

// The fill pattern has a period of 251 bytes, so a shifted or misplaced
// copy of it does not compare equal.
const patPeriod = 251

var patBlock = func() []byte {
	b := make([]byte, patPeriod*64)
	for i := range b {
		b[i] = byte(i%patPeriod) ^ 0xa5
	}
	return b
}()

// FillPattern fills b with the position-dependent pattern.
func FillPattern(b []byte) {
	for off := 0; off < len(b); {
		off += copy(b[off:], patBlock[off%patPeriod:])
	}
}

// patternBad returns the index of the first byte of b[from:to] that no
// longer holds the pattern FillPattern(b) wrote, or -1.
func patternBad(b []byte, from, to int) int {
	for off := from; off < to; {
		want := patBlock[off%patPeriod:]
		n := min(len(want), to-off)
		if !bytes.Equal(b[off:off+n], want[:n]) {
			for i := range n {
				if b[off+i] != want[i] {
					return off + i
				}
			}
		}
		off += n
	}
	return -1
}

// checkPattern fails t if b[from:to] does not hold the fill pattern.
func checkPattern(t testing.TB, what string, b []byte, from, to int) bool {
	t.Helper()
	if i := patternBad(b, from, to); i >= 0 {
		t.Errorf("%s: byte %d of [%d,%d) was overwritten (%#02x)", what, i, from, to, b[i])
		return false
	}
	return true
}

// FillRandom fills b with random bytes from seed.
func FillRandom(b []byte, seed uint64) {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	rand.NewChaCha8(s).Read(b)
}

// checkEqual fails t unless got equals want, naming the first difference.
func checkEqual(t testing.TB, what string, got, want []byte) bool {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: length %d, want %d", what, len(got), len(want))
		return false
	}
	if bytes.Equal(got, want) {
		return true
	}
	bad := 0
	first := -1
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			bad++
		}
	}
	t.Errorf("%s: %d of %d bytes differ, first at %d (got %#02x, want %#02x)", what, bad, len(got), first, got[first], want[first])
	return false
}

// Status sets the suite accepts where providers legitimately differ.
var (
	remoteErrors = []verbs.Status{verbs.StatusRemoteAccess, verbs.StatusRemoteInvalid, verbs.StatusRemoteOp}
	localErrors  = []verbs.Status{verbs.StatusLocalProtect, verbs.StatusLocalAccess}
)

func fmtStatuses(ss []verbs.Status) string {
	s := ""
	for i, x := range ss {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q", x)
	}
	return "{" + s + "}"
}

// checkStatusIn fails t unless c has one of the statuses in set.
func checkStatusIn(t testing.TB, what string, c verbs.Completion, set []verbs.Status) bool {
	t.Helper()
	if !slices.Contains(set, c.Status) {
		t.Errorf("%s: completion %s, want status in %s", what, fmtCompletion(c), fmtStatuses(set))
		return false
	}
	return true
}

// checkOK fails t unless c is a successful completion of wrid and op.
func checkOK(t testing.TB, what string, c verbs.Completion, wrid uint64, op verbs.Opcode) bool {
	t.Helper()
	if c.Status != verbs.StatusSuccess || c.WRID != wrid || c.Op != op {
		t.Errorf("%s: completion %s, want wr %#x %v success", what, fmtCompletion(c), wrid, op)
		return false
	}
	return true
}

// checkFlushed fails t unless cs are flush completions of ids, in order.
func checkFlushed(t testing.TB, what string, cs []verbs.Completion, ids []uint64) {
	t.Helper()
	for i, c := range cs {
		if c.WRID != ids[i] || c.Status != verbs.StatusWRFlush {
			t.Errorf("%s: completion %d is %s, want wr %#x flushed", what, i, fmtCompletion(c), ids[i])
		}
	}
}

// checkOrder fails t unless cs carry ids, in order.
func checkOrder(t testing.TB, what string, cs []verbs.Completion, ids []uint64) {
	t.Helper()
	for i, c := range cs {
		if c.WRID != ids[i] {
			t.Errorf("%s: completion %d is %s, want wr %#x (order of posting)", what, i, fmtCompletion(c), ids[i])
			return
		}
	}
}
