// Package blockdev reads what rdmacp needs to know of block devices:
// their size, logical block size, whether they are mounted, and a write
// generation that changes when they are written.
package blockdev

import (
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Is reports whether fi is a block device.
func Is(fi fs.FileInfo) bool {
	return fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0
}

// Size is a block device's size in bytes (BLKGETSIZE64).
func Size(f *os.File) (int64, error) {
	var n uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&n))); e != 0 {
		return 0, &fs.PathError{Op: "BLKGETSIZE64", Path: f.Name(), Err: e}
	}
	return int64(n), nil
}

// LogicalBlockSize is a block device's logical block size (BLKSSZGET).
func LogicalBlockSize(f *os.File) (int, error) {
	n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
	if err != nil {
		return 0, &fs.PathError{Op: "BLKSSZGET", Path: f.Name(), Err: err}
	}
	return n, nil
}

// Generation stands in for a block device's mtime: the writes and
// sectors written that the kernel has counted for it
// (/sys/dev/block/MAJ:MIN/stat), which change when it is written.
func Generation(fi fs.FileInfo) int64 {
	dev, ok := rdev(fi)
	if !ok {
		return 0
	}
	p := "/sys/dev/block/" + dev + "/stat"
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 7 {
		return 0
	}
	writes, _ := strconv.ParseInt(f[4], 10, 64)
	sectors, _ := strconv.ParseInt(f[6], 10, 64)
	return writes<<32 ^ sectors
}

// rdev is a device file's "MAJ:MIN".
func rdev(fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), true
}

// Mounted reports whether the block device fi is mounted, by its
// MAJ:MIN in /proc/self/mountinfo.
func Mounted(fi fs.FileInfo) (bool, error) {
	dev, ok := rdev(fi)
	if !ok {
		return false, nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == dev {
			return true, nil
		}
	}
	return false, nil
}
