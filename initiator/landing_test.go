package initiator

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkLanding compares the two ways a READ's bytes can reach a new
// file: into a reused registered staging buffer and then pwrite (what
// the initiator does), or straight into a shared mapping of the file
// (what registering the destination's mapping would do; the copy here
// stands in for the NIC's or the software provider's placement).
func BenchmarkLanding(b *testing.B) {
	const size = 256 << 20
	const chunk = 4 << 20
	src := make([]byte, chunk)
	for i := range src {
		src[i] = byte(i * 7)
	}
	dir := b.TempDir()
	b.Run("pwrite", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			f, _ := os.Create(filepath.Join(dir, "p"))
			unix.Fallocate(int(f.Fd()), 0, 0, size)
			for off := int64(0); off < size; off += chunk {
				if _, err := f.WriteAt(src, off); err != nil {
					b.Fatal(err)
				}
			}
			f.Close()
			os.Remove(f.Name())
		}
	})
	b.Run("mmap", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; i < b.N; i++ {
			f, _ := os.Create(filepath.Join(dir, "m"))
			unix.Fallocate(int(f.Fd()), 0, 0, size)
			m, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				b.Fatal(err)
			}
			for off := 0; off < size; off += chunk {
				copy(m[off:off+chunk], src)
			}
			unix.Munmap(m)
			f.Close()
			os.Remove(f.Name())
		}
	})
}
