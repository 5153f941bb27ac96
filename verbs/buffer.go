package verbs

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is off-heap memory for registration: anonymous pages from mmap,
// never touched by the Go garbage collector.
type Buffer struct {
	b []byte
}

// AllocBuffer maps n bytes of zeroed, private, anonymous memory.
func AllocBuffer(n int) (*Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("alloc buffer: size %d: %w", n, ErrInvalid)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, &OpError{Op: "mmap", Provider: "buffer", Err: err}
	}
	return &Buffer{b: b}, nil
}

// Bytes returns the memory. It is invalid after Free.
func (b *Buffer) Bytes() []byte { return b.b }

// Free unmaps the memory; every MR over it must be closed first.
func (b *Buffer) Free() error {
	if b.b == nil {
		return nil
	}
	err := unix.Munmap(b.b)
	b.b = nil
	return err
}

// AddrOf is the address of p[0], as used in SGEs and remote addresses.
func AddrOf(p []byte) uint64 {
	if len(p) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&p[0])))
}
