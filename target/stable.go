package target

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// A file is served only if its size says how many bytes it holds: the
// initiator maps, hashes and verifies exactly that many. A regular file of
// a pseudo file system (procfs, sysfs…) has a size that says nothing (0, or
// 4096, whatever its contents), and a 0-byte file that still reads data
// (FUSE direct_io, some drivers' files) would arrive empty with success.
// Character devices, FIFOs and sockets have no size at all.

// pseudoFS names the file systems whose regular files have no stable size,
// by statfs f_type.
var pseudoFS = map[int64]string{
	unix.PROC_SUPER_MAGIC:    "procfs",
	unix.SYSFS_MAGIC:         "sysfs",
	unix.DEBUGFS_MAGIC:       "debugfs",
	unix.TRACEFS_MAGIC:       "tracefs",
	unix.SECURITYFS_MAGIC:    "securityfs",
	unix.CGROUP_SUPER_MAGIC:  "cgroup",
	unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	0x62656570:               "configfs", // CONFIGFS_MAGIC
	unix.BPF_FS_MAGIC:        "bpf",
}

// unstable says why the open file fd, whose fstat is st, cannot be served
// ("" if it can). It costs an fstatfs for a regular file, and for a 0-byte
// one a 1-byte pread.
func unstable(fd int, st *unix.Stat_t) string {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		return ""
	case unix.S_IFREG:
	default:
		return "is not a regular file or block device"
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return fmt.Sprintf("its file system cannot be checked (statfs: %v)", err)
	}
	if name, ok := pseudoFS[int64(sfs.Type)]; ok {
		return "is on " + name + ", a pseudo file system whose sizes say nothing of the contents"
	}
	if st.Size == 0 && readsData(fd) {
		return "is 0 bytes long but reading it returns data"
	}
	return ""
}

// readsData reports whether a 1-byte read at offset 0 of fd returns a
// byte.
func readsData(fd int) bool {
	var b [1]byte
	for {
		n, err := unix.Pread(fd, b[:], 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

// stableError is the refusal of a file that unstable finds fault with:
// CodeUnsupported, which the initiator reports as a remote failure (exit 5).
func stableError(p, why string) *protocol.Error {
	return errf(protocol.CodeUnsupported, "%s %s; only regular files and block devices whose size is their length are served", p, why)
}

// stableFd refuses (as stableError) the open file fd, named p in replies,
// whose fstat is st, unless its size can be trusted. Pack, which opens
// with openat and fstat, calls it with what it has; Walk calls unstable
// through its walker, which remembers the file systems it checked.
func stableFd(p string, fd int, st *unix.Stat_t) *protocol.Error {
	if why := unstable(fd, st); why != "" {
		return stableError(p, why)
	}
	return nil
}

// stableFile is stableFd for an *os.File, without putting it in blocking
// mode as Fd would.
func stableFile(p string, f *os.File) *protocol.Error {
	rc, err := f.SyscallConn()
	if err != nil {
		return errf(protocol.CodeInternal, "%s: %v", p, err)
	}
	var perr *protocol.Error
	cerr := rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if err := unix.Fstat(int(fd), &st); err != nil {
			perr = fsError(p, &os.PathError{Op: "fstat", Path: p, Err: err})
			return
		}
		perr = stableFd(p, int(fd), &st)
	})
	if cerr != nil {
		return errf(protocol.CodeInternal, "%s: %v", p, cerr)
	}
	return perr
}
