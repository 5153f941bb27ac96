package local

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
)

// Reserve makes room for the chunks of layout that hold data (all of
// them when ext is nil: a target that lists no extents, or a device
// source), so that a full disk shows up before the first byte, and the
// chunks that stay holes take no space. Chunks are what the fetch
// writes, whole, so the reservation is exactly what it will write. The
// extents are already held by the fetch (at most maxExtents), so this
// costs no memory of its own; adjacent data chunks merge into one
// fallocate.
//
// In a tmpfs with 4 KiB pages it only checks the free space (roomFor):
// there a fallocate allocates every page of the file at once, before the
// first READ is posted, where a pwrite allocates each page as its chunk
// lands, on the other core from the receive. Measured on the 2-core VM
// (1 GiB into /dev/shm): the fallocate took 0.24 s of a 0.7-0.9 s cp,
// with nothing else running, and was 35% of the initiator's profile. A
// tmpfs with huge pages is still fallocated: a mapped landing
// (initiator/landmap.go) lands there through a mapping, where a page the
// file system can't give is a SIGBUS in the receive copy, not an error.
func Reserve(f *os.File, ext *ExtentMap, layout chunker.Layout) error {
	if lazy, room, held := reservesLazily(f); lazy {
		return roomFor(dataBytes(ext, layout), room, held)
	}
	var err error
	dataRanges(ext, layout, func(off, n int64) bool {
		err = unix.Fallocate(int(f.Fd()), 0, off, n)
		return err == nil
	})
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil // the file system reserves nothing; writes find out
	}
	return err
}

// reservesLazily reports whether f is a regular file in a tmpfs without
// huge pages (Reserve), that file system's free bytes (-1: no limit) and
// the bytes f holds already.
func reservesLazily(f *os.File) (lazy bool, room, held int64) {
	fd := int(f.Fd())
	var st unix.Stat_t
	var sf unix.Statfs_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		unix.Fstatfs(fd, &sf) != nil || sf.Type != unix.TMPFS_MAGIC || HugeTmpfs(f) {
		return false, 0, 0
	}
	held = st.Blocks * 512
	if sf.Blocks == 0 { // size=0: a tmpfs without a limit
		return true, -1, held
	}
	return true, int64(sf.Bavail) * sf.Bsize, held
}

// roomFor fails with ENOSPC when the free bytes room (-1: no limit) can't
// take the need bytes, of which the file holds held already. Unlike a
// fallocate it holds nothing back from other writers: one that fills the
// file system during the copy makes a write fail with ENOSPC instead, and
// the copy fails then, as on a file system without fallocate.
func roomFor(need, room, held int64) error {
	if room >= 0 && need-held > room {
		return unix.ENOSPC
	}
	return nil
}

// HugeTmpfs reports whether f is in a tmpfs mounted with huge pages
// (huge=always or huge=within_size), from mountinfo. A tree copy asks
// for every file, so the answer is kept per mount, by the mount's unique
// id (Linux 6.8 and later; before, mountinfo is read each time): a
// device number alone is reused by the next tmpfs mounted.
func HugeTmpfs(f *os.File) bool {
	fd := int(f.Fd())
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &st); err != nil {
		return false
	}
	dev := unix.Mkdev(st.Dev_major, st.Dev_minor)
	key := mountKey{dev, st.Mnt_id}
	unique := st.Mask&unix.STATX_MNT_ID_UNIQUE != 0
	if h, ok := hugeByMount.Load(key); ok && unique {
		return h.(bool)
	}
	b, err := readMountinfo()
	if err != nil {
		return false
	}
	h := hugeIn(string(b), st.Dev_major, st.Dev_minor)
	if unique {
		hugeByMount.Store(key, h)
	}
	return h
}

type mountKey struct{ dev, mnt uint64 }

var (
	hugeByMount   sync.Map // mountKey → HugeTmpfs's answer
	readMountinfo = func() ([]byte, error) { return os.ReadFile("/proc/self/mountinfo") }
)

// hugeIn is HugeTmpfs on mountinfo's text.
func hugeIn(mountinfo string, major, minor uint32) bool {
	id := fmt.Sprintf("%d:%d", major, minor)
	for line := range strings.Lines(mountinfo) {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != id {
			continue
		}
		_, super, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		sf := strings.Fields(super)
		if len(sf) < 3 || sf[0] != "tmpfs" {
			continue
		}
		for o := range strings.SplitSeq(sf[2], ",") {
			if o == "huge=always" || o == "huge=within_size" {
				return true
			}
		}
	}
	return false
}
