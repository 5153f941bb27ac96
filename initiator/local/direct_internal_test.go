package local

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBufferedWritesOneAtATime(t *testing.T) {
	// The verifiers write chunks concurrently; into a regular file the
	// sink lets one buffered write run at a time (the kernel would
	// serialize them anyway, spinning), into a device all at once.
	for _, kind := range []DestKind{DestFresh, destDevice} {
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var in, most atomic.Int32
		old := pwrite
		pwrite = func(f *os.File, p []byte, off int64) (int, error) {
			n := in.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(2 * time.Millisecond)
			in.Add(-1)
			return old(f, p, off)
		}
		s := NewSink(f, false, nil)
		s.Kind = kind
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				p := make([]byte, 4096)
				for j := range 5 {
					if _, err := s.WriteAt(p, int64(i*5+j)*4096); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		pwrite = old
		switch {
		case kind == DestFresh && most.Load() != 1:
			t.Errorf("a regular file had %d buffered writes at once, want 1", most.Load())
		case kind == destDevice && most.Load() < 2:
			t.Errorf("a device had at most %d buffered writes at once, want them in parallel", most.Load())
		}
		if fi, _ := f.Stat(); fi.Size() != 20*4096 {
			t.Errorf("%v: size %d, want %d", kind, fi.Size(), 20*4096)
		}
	}
}
