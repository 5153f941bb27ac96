// Package chunker splits files into fixed-size chunks and computes their
// digests: per chunk, for the whole file, in parallel, and with a cache so
// that a file served twice is hashed once.
//
// The initiator checks every chunk it reads against the target's digest for
// that chunk, and the whole file against the file digest.
package chunker

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"

	"lukechampine.com/blake3"

	"github.com/rdmacp/rdmacp/crc32c"
)

// Algorithm is a chunk digest algorithm. Its numeric values travel on the
// wire (protocol.Open and OpenReply), so they must not change.
type Algorithm uint8

const (
	// CRC32C is the default: CRC-32 with the Castagnoli polynomial, which
	// hash/crc32 computes with SSE4.2 or ARMv8 CRC instructions. It catches
	// transfer corruption, not tampering.
	CRC32C Algorithm = iota
	// BLAKE3 is the 256-bit BLAKE3 hash.
	BLAKE3
	// None computes nothing: digests are empty and nothing is verified.
	None
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ParseAlgorithm parses an algorithm name as users type it: "crc32c",
// "blake3" or "none".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "crc32c":
		return CRC32C, nil
	case "blake3":
		return BLAKE3, nil
	case "none":
		return None, nil
	}
	return 0, fmt.Errorf("chunker: unknown digest algorithm %q (want crc32c, blake3 or none)", s)
}

// String returns the algorithm's name as ParseAlgorithm accepts it.
func (a Algorithm) String() string {
	switch a {
	case CRC32C:
		return "crc32c"
	case BLAKE3:
		return "blake3"
	case None:
		return "none"
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// Valid reports whether a is a known algorithm.
func (a Algorithm) Valid() bool { return a <= None }

// Size is the length of one digest in bytes: 4, 32 or 0. It is 0 for an
// unknown algorithm too.
func (a Algorithm) Size() int {
	switch a {
	case CRC32C:
		return 4
	case BLAKE3:
		return 32
	}
	return 0
}

// DefaultChunkSize is the chunk size when none is asked for. It is
// provisional: it has not been measured against real transfers yet.
const DefaultChunkSize = 4 << 20

// Bounds on chunk sizes. Chunks are a multiple of MinChunkSize so that they
// line up with pages and O_DIRECT reads.
const (
	MinChunkSize = 4096
	MaxChunkSize = 256 << 20
)

// ValidateChunkSize checks that n is within [MinChunkSize, MaxChunkSize] and
// a multiple of MinChunkSize. It need not be a power of two.
func ValidateChunkSize(n int64) error {
	if n < MinChunkSize || n > MaxChunkSize {
		return fmt.Errorf("chunker: chunk size %d out of range [%d, %d]", n, MinChunkSize, MaxChunkSize)
	}
	if n%MinChunkSize != 0 {
		return fmt.Errorf("chunker: chunk size %d is not a multiple of %d", n, MinChunkSize)
	}
	return nil
}

// Layout is how a file of Size bytes splits into chunks of ChunkSize bytes;
// the last chunk may be shorter. A file of size 0 has no chunks.
type Layout struct {
	Size      int64
	ChunkSize int64
}

// Validate checks that the layout is usable: Size is not negative and
// ChunkSize is positive. It does not apply ValidateChunkSize's bounds.
func (l Layout) Validate() error {
	if l.Size < 0 {
		return fmt.Errorf("chunker: negative file size %d", l.Size)
	}
	if l.ChunkSize <= 0 {
		return fmt.Errorf("chunker: chunk size %d is not positive", l.ChunkSize)
	}
	return nil
}

// Chunks is the number of chunks. It is 0 for an invalid layout.
func (l Layout) Chunks() int {
	if l.Size <= 0 || l.ChunkSize <= 0 {
		return 0
	}
	return int((l.Size-1)/l.ChunkSize + 1)
}

// Chunk returns the file offset and length of chunk i. It panics if i is out
// of range.
func (l Layout) Chunk(i int) (off, length int64) {
	if i < 0 || i >= l.Chunks() {
		panic(fmt.Sprintf("chunker: chunk %d out of range [0, %d)", i, l.Chunks()))
	}
	off = int64(i) * l.ChunkSize
	return off, min(l.ChunkSize, l.Size-off)
}

// AppendSum appends the digest of p to dst. For CRC32C and None it does not
// allocate when dst has room for alg.Size() more bytes; the blake3 library
// allocates for inputs over 1 KiB, which it hashes with goroutines.
func AppendSum(dst []byte, alg Algorithm, p []byte) []byte {
	switch alg {
	case CRC32C:
		return binary.BigEndian.AppendUint32(dst, crc32c.UpdateCold(0, p)) // a chunk just landed is past L2
	case BLAKE3:
		sum := blake3.Sum256(p)
		return append(dst, sum[:]...)
	}
	return dst
}

// Sum returns the digest of p in a new slice.
func Sum(alg Algorithm, p []byte) []byte {
	return AppendSum(make([]byte, 0, alg.Size()), alg, p)
}

// Equal reports whether two digests are the same. Digests are not secrets,
// so the comparison need not be constant-time.
func Equal(a, b []byte) bool { return bytes.Equal(a, b) }

// FormatDigest formats a digest for people and logs: "crc32c:0a1b2c3d",
// "blake3:…", or "none".
func FormatDigest(alg Algorithm, d []byte) string {
	if alg == None {
		return "none"
	}
	return alg.String() + ":" + hex.EncodeToString(d)
}

// ErrChanged reports that a file changed while it was being hashed.
var ErrChanged = errors.New("chunker: file changed while hashing")
