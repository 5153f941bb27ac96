package target

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// extents lists the data ranges of f within [off, end), at most max of
// them, with SEEK_DATA and SEEK_HOLE; next is where the next page starts
// (0: none). dense files (block devices, where SEEK_DATA says nothing)
// and file systems without SEEK_DATA are all data. The file offset is
// moved, which nothing else on the target uses: reads are preads.
func extents(f *os.File, dense bool, off, end int64, max int) (xs []protocol.Extent, next int64, err error) {
	if off >= end {
		return nil, 0, nil
	}
	if dense {
		return []protocol.Extent{{Offset: uint64(off), Length: uint64(end - off)}}, 0, nil
	}
	fd := int(f.Fd())
	for off < end {
		if len(xs) == max {
			return xs, off, nil
		}
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || (err == nil && data >= end) {
			return xs, 0, nil // holes to the end
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return append(xs, protocol.Extent{Offset: uint64(off), Length: uint64(end - off)}), 0, nil
		}
		if err != nil {
			return nil, 0, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return nil, 0, err
		}
		hole = min(hole, end)
		if hole <= data { // the file shrank under us: the rest is no data
			return xs, 0, nil
		}
		xs = append(xs, protocol.Extent{Offset: uint64(data), Length: uint64(hole - data)})
		off = hole
	}
	return xs, 0, nil
}

// openFlags is OpenReply's Flags for h: OpenDense where the file is one
// data extent (a block device, or a regular file without holes), so the
// initiator need not ask for Extents. One SEEK_DATA and one SEEK_HOLE,
// through extents, the one place holes are found.
func openFlags(h *handle) uint8 {
	if h.size == 0 {
		return 0
	}
	xs, next, err := extents(h.f, h.blockdev, 0, h.size, 2)
	if err != nil || next != 0 || len(xs) != 1 || xs[0].Offset != 0 || int64(xs[0].Length) != h.size {
		return 0
	}
	return protocol.OpenDense
}

// holeChunks says, for the chunks of cs bytes from chunk first on that
// cover [off, end) (off is chunk first's offset), which lie wholly in
// holes: none of their bytes is data. Past maxExtents extents the rest
// counts as data, which costs a read, never a wrong digest.
func holeChunks(f *os.File, dense bool, off, end, cs int64, first int) (func(i int) bool, error) {
	if dense {
		return nil, nil
	}
	xs, next, err := extents(f, dense, off, end, maxExtents)
	if err != nil {
		return nil, err
	}
	data := make([]bool, (end-off+cs-1)/cs)
	mark := func(from, to int64) {
		for c := (from - off) / cs; c < int64(len(data)) && off+c*cs < to; c++ {
			data[c] = true
		}
	}
	for _, x := range xs {
		mark(int64(x.Offset), int64(x.Offset+x.Length))
	}
	if next != 0 {
		mark(next, end)
	}
	return func(i int) bool { j := i - first; return j >= 0 && j < len(data) && !data[j] }, nil
}

// maxExtents bounds the extents one window's hole check lists.
const maxExtents = 1 << 16
