package tree

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/protocol"
)

// setMtime needs no procfs: it names the file by its descriptor alone
// (futimens), as a copy into a container or chroot without /proc must.
// The check runs on a thread of its own in a mount namespace of its own,
// with an empty tmpfs over /proc.
func TestSetMtimeWithoutProc(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const ns = 1_600_000_000_123_456_789
	errSkip := errors.New("skip")
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, in its own mount namespace, ends
		// with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("%w: unshare: %v (needs root)", errSkip, err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			done <- fmt.Errorf("%w: make / private: %v", errSkip, err)
			return
		}
		if err := unix.Mount("none", "/proc", "tmpfs", 0, ""); err != nil {
			done <- fmt.Errorf("%w: tmpfs over /proc: %v", errSkip, err)
			return
		}
		done <- local.SetMtime(f.Fd(), ns)
	}()
	err = <-done
	if errors.Is(err, errSkip) {
		t.Skip("SKIP:", err)
	}
	if err != nil {
		t.Fatalf("setMtime without /proc: %v", err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.ModTime().UnixNano(); got != ns {
		t.Errorf("mtime %d, want %d", got, ns)
	}
}

// BenchmarkWriteSmall is the landing of one packed small file alone (its
// create, write, mtime and close), the per-file cost of a tree copy of
// small files once the bytes are verified, into a directory in tmpfs
// where there is one:
//
//	go test -run '^$' -bench WriteSmall ./initiator
func BenchmarkWriteSmall(b *testing.B) {
	for _, size := range []int{512, 4 << 10} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			d, err := os.MkdirTemp("/dev/shm", "rdmacp-bench-")
			if err != nil {
				d = b.TempDir()
			}
			b.Cleanup(func() { os.RemoveAll(d) })
			dir, err := os.Open(d)
			if err != nil {
				b.Fatal(err)
			}
			defer dir.Close()
			data := make([]byte, size)
			e := protocol.Entry{Type: protocol.FileRegular, Mode: 0o644, Size: uint64(size), MtimeNs: 1_600_000_000_123_456_789}
			b.SetBytes(int64(size))
			n := 0
			for b.Loop() {
				if err := writeSmall(dir, fmt.Sprintf("f%07d", n), e, data); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.StopTimer()
			fi, err := os.Stat(fmt.Sprintf("%s/f%07d", d, n-1))
			if err != nil || fi.ModTime().UnixNano() != e.MtimeNs || fi.Size() != int64(size) {
				b.Fatalf("last file: %v, %v", fi, err)
			}
		})
	}
}
