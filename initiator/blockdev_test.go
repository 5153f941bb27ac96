package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/local"
	"github.com/rdmacp/rdmacp/target"
)

// loopDevice attaches a loop device to a new image of size bytes (random
// content when fill is set) and detaches it when the test ends.
func loopDevice(t *testing.T, size int, fill bool) (dev string, content []byte) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	img := filepath.Join(t.TempDir(), "img")
	if fill {
		content = randomFile(t, img, size)
	} else if err := os.WriteFile(img, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		t.Skipf("no loop devices here (losetup: %v: %s)", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev, content
}

func readDev(t *testing.T, dev string, n int) []byte {
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBlockDeviceExport(t *testing.T) {
	src, want := loopDevice(t, 8<<20+4096, true)
	big, _ := loopDevice(t, 16<<20, false)
	small, _ := loopDevice(t, 4<<20, false)
	e := startTarget(t, func(c *target.Config) {
		c.Exports = append(c.Exports, target.Export{Name: "disk0", Path: src})
	})
	s := e.Dial(t, nil)
	ctx := context.Background()

	ent, err := s.Stat(ctx, "disk0")
	if err != nil || ent.Size != uint64(len(want)) {
		t.Fatalf("stat disk0: %+v %v, want a %d-byte block device", ent, err, len(want))
	}
	// Into a file.
	img := filepath.Join(t.TempDir(), "disk.img")
	if _, err := s.Get(ctx, "disk0", img, initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(img); !bytes.Equal(got, want) {
		t.Fatal("image differs from the device")
	}
	// Onto another device: only with Force, never a smaller one.
	if _, err := s.Get(ctx, "disk0", big, initiator.GetOptions{}); !errors.Is(err, local.ErrDest) {
		t.Fatalf("device without Force: %v", err)
	}
	if _, err := s.Get(ctx, "disk0", small, initiator.GetOptions{Force: true}); !errors.Is(err, local.ErrDest) || !strings.Contains(err.Error(), "bytes") {
		t.Fatalf("smaller device: %v", err)
	}
	res, err := s.Get(ctx, "disk0", big, initiator.GetOptions{Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readDev(t, big, len(want)); !bytes.Equal(got, want) {
		t.Fatal("device copy differs")
	}
	// A device takes O_DIRECT: every chunk of this size goes that way.
	if d := initiator.DirectBytes(res); d != int64(len(want)) {
		t.Errorf("%d of %d bytes landed on the device with O_DIRECT", d, len(want))
	}
	// A file with a short tail onto the device: the tail goes buffered,
	// the rest direct, and the device reads back exact.
	odd := randomFile(t, filepath.Join(e.Dir, "odd"), 5*testChunk+17)
	if res, err = s.Get(ctx, "data/odd", big, initiator.GetOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := readDev(t, big, len(odd)); !bytes.Equal(got, odd) {
		t.Fatal("device copy of a file with a short tail differs")
	}
	if d := initiator.DirectBytes(res); d != 5*testChunk {
		t.Errorf("%d bytes landed on the device with O_DIRECT, want %d", d, 5*testChunk)
	}
	if _, err := os.Stat(big); err != nil {
		t.Fatal("the destination device node is gone")
	}
}

func TestBlockDeviceMountedRefused(t *testing.T) {
	dev, _ := loopDevice(t, 16<<20, false)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", dev).CombinedOutput(); err != nil {
		t.Skipf("mkfs.ext4: %v %s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		t.Skipf("mount: %v %s", err, out)
	}
	defer exec.Command("umount", mnt).Run()
	e := startTarget(t, nil)
	randomFile(t, filepath.Join(e.Dir, "f"), 1<<20)
	s := e.Dial(t, nil)
	_, err := s.Get(context.Background(), "data/f", dev, initiator.GetOptions{Force: true})
	if !errors.Is(err, local.ErrDest) || !strings.Contains(err.Error(), "mounted") {
		t.Fatalf("mounted device: %v", err)
	}
}

func TestBlockDeviceChangedDuringCopy(t *testing.T) {
	src, _ := loopDevice(t, 8<<20, true)
	e := startTarget(t, func(c *target.Config) {
		c.Exports = append(c.Exports, target.Export{Name: "disk0", Path: src})
		c.MaxWindow = 64 << 10
	})
	s := e.Dial(t, func(c *initiator.Config) { c.QPs = 1; c.Depth = 1; c.Retries = 1 })
	var once sync.Once
	_, err := s.Get(context.Background(), "disk0", filepath.Join(t.TempDir(), "img"), initiator.GetOptions{Progress: func(initiator.Progress) {
		once.Do(func() {
			f, err := os.OpenFile(src, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			f.WriteAt(bytes.Repeat([]byte{0xee}, 4096), 6<<20)
			f.Sync()
			f.Close()
		})
	}})
	if !errors.Is(err, initiator.ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
}
