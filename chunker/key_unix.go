//go:build unix

package chunker

import (
	"fmt"
	"os"
	"syscall"
)

// KeyFor returns the cache key for a file's digests from its FileInfo,
// which must come from os.Stat, os.Lstat or (*os.File).Stat. The inode
// generation (FS_IOC_GETVERSION) is not in it: it would cost an ioctl on
// every lookup, and a reused inode number already gets a new ctime.
func KeyFor(fi os.FileInfo, chunkSize int64, alg Algorithm) (Key, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return Key{}, fmt.Errorf("chunker: %s: no stat data in FileInfo (%T)", fi.Name(), fi.Sys())
	}
	return Key{
		Dev:       uint64(st.Dev),
		Ino:       uint64(st.Ino),
		Size:      fi.Size(),
		MtimeNs:   fi.ModTime().UnixNano(),
		CtimeNs:   st.Ctim.Nano(),
		ChunkSize: chunkSize,
		Alg:       alg,
	}, nil
}
