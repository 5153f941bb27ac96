package initiator

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/initiator/local"

	"golang.org/x/sys/unix"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/verbs"
)

// benchDir is a directory on a disk file system for landing benchmarks:
// $RDMACP_BENCH_DIR, else /var/tmp (/tmp may be a tmpfs).
func benchDir(b *testing.B) string {
	base := os.Getenv("RDMACP_BENCH_DIR")
	if base == "" {
		base = "/var/tmp"
	}
	dir, err := os.MkdirTemp(base, "rdmacp-landing-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	var sf unix.Statfs_t
	if unix.Statfs(dir, &sf) == nil && sf.Type == unix.TMPFS_MAGIC {
		b.Logf("%s is a tmpfs: the direct case lands buffered", dir)
	}
	return dir
}

// machineCPU is the CPU time all of the machine has spent busy, the
// kernel's writeback threads included (which procCPU does not see); other
// load on the machine counts too.
func machineCPU() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	var user, nice, system, idle, iowait, irq, softirq int64
	fmt.Sscanf(string(b), "cpu %d %d %d %d %d %d %d", &user, &nice, &system, &idle, &iowait, &irq, &softirq)
	return time.Duration(user+nice+system+irq+softirq) * (time.Second / 100) // USER_HZ
}

func procCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLanding compares the ways a verified chunk's bytes can reach a
// new file, as a copy lands them: from registered (mmap'd) staging slots
// by verifiers-many writers into a fresh fallocated file, then fsync.
//
//	buffered: pwrite into the page cache (--no-direct)
//	direct:   the sink's O_DIRECT path (the default on disk file systems);
//	          direct-x2 with twice the writers, i.e. writes in flight
//	mmap:     a copy into a shared mapping of the file, standing in for
//	          registering the destination's mapping as the READ sink
//
// It reports the process's CPU seconds per GB beside the throughput, and
// the whole machine's (which includes the kernel's writeback threads, and
// whatever else runs). Run it on a disk file system (RDMACP_BENCH_DIR,
// default /var/tmp), and interleave the cases on a busy machine:
//
//	go test -c -o /tmp/initiator.test ./initiator
//	for i in 1 2 3 4 5; do /tmp/initiator.test -test.run - -test.bench Landing -test.benchtime 3x; done
func BenchmarkLanding(b *testing.B) {
	const size = 512 << 20
	const chunk = 4 << 20
	stage, err := verbs.AllocBuffer(verifiers * chunk)
	if err != nil {
		b.Fatal(err)
	}
	defer stage.Free()
	src := stage.Bytes()
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	dir := benchDir(b)
	newFile := func(b *testing.B) *os.File {
		f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		if err := local.Allocate(f, size); err != nil {
			b.Fatal(err)
		}
		if err := local.Reserve(f, nil, chunker.Layout{Size: size, ChunkSize: chunk}); err != nil {
			b.Fatal(err)
		}
		return f
	}
	// land writes the file's chunks with verifiers-many goroutines, each
	// from its own slot, as the fetch's verifiers do.
	land := func(b *testing.B, writers int, write func(p []byte, off int64) error) {
		var wg sync.WaitGroup
		next := make(chan int64, size/chunk)
		for off := int64(0); off < size; off += chunk {
			next <- off
		}
		close(next)
		for w := range writers {
			slot := src[w%verifiers*chunk:][:chunk]
			wg.Go(func() {
				for off := range next {
					if err := write(slot, off); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
	}
	perGB := func(b *testing.B, cpu, all time.Duration) {
		gb := float64(size) * float64(b.N) / 1e9
		b.ReportMetric(cpu.Seconds()/gb, "cpu-s/GB")
		b.ReportMetric(all.Seconds()/gb, "machine-cpu-s/GB")
	}
	for _, c := range []struct {
		name    string
		direct  bool
		writers int
	}{{"buffered", false, verifiers}, {"direct", true, verifiers}, {"direct-x2", true, 2 * verifiers}} {
		direct := c.direct
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(size)
			var cpu, all time.Duration
			for b.Loop() {
				b.StopTimer()
				f := newFile(b)
				b.StartTimer()
				c0, a0 := procCPU(), machineCPU()
				s := local.NewSink(f, direct, slog.New(slog.DiscardHandler))
				if direct && s.Direct == nil {
					b.Fatalf("no O_DIRECT here: %s", s.Why)
				}
				land(b, c.writers, func(p []byte, off int64) error { _, err := s.WriteAt(p, off); return err })
				s.Close()
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				cpu, all = cpu+procCPU()-c0, all+machineCPU()-a0
				b.StopTimer()
				if direct && s.DirectBytes() != size {
					b.Fatalf("%d bytes direct, want %d", s.DirectBytes(), size)
				}
				f.Close()
				os.Remove(f.Name())
				b.StartTimer()
			}
			perGB(b, cpu, all)
		})
	}
	b.Run("mmap", func(b *testing.B) {
		b.SetBytes(size)
		var cpu, all time.Duration
		for b.Loop() {
			b.StopTimer()
			f := newFile(b)
			b.StartTimer()
			c0, a0 := procCPU(), machineCPU()
			m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			land(b, verifiers, func(p []byte, off int64) error { copy(m[off:off+chunk], p); return nil })
			unix.Munmap(m)
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			cpu, all = cpu+procCPU()-c0, all+machineCPU()-a0
			b.StopTimer()
			f.Close()
			os.Remove(f.Name())
			b.StartTimer()
		}
		perGB(b, cpu, all)
	})
}
