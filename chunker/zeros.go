package chunker

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/rdmacp/rdmacp/crc32c"
	"lukechampine.com/blake3"
)

// zeroSums memoizes ZeroDigest: a file's chunks have at most two lengths
// (ChunkSize and its last), so a sparse file's holes cost one hash of a
// chunk of zeros per length, not one per hole.
var zeroSums sync.Map // zeroKey -> []byte

type zeroKey struct {
	alg Algorithm
	n   int64
}

// zeroBlock is what ZeroDigest hashes at a time: zeros that are never
// written, read from no file.
var zeroBlock = make([]byte, 64<<10)

// ZeroDigest is the digest of n zero bytes, as AppendSum would compute it
// over a buffer of n zeros: the digest of a chunk that lies in a hole. It
// reads no file; CRC32C derives it arithmetically, BLAKE3 hashes zeros in
// memory once per n. The result is shared and must not be modified.
func ZeroDigest(alg Algorithm, n int64) []byte {
	if alg.Size() == 0 || n < 0 {
		return []byte{}
	}
	k := zeroKey{alg, n}
	if d, ok := zeroSums.Load(k); ok {
		return d.([]byte)
	}
	var d []byte
	switch alg {
	case CRC32C:
		d = binary.BigEndian.AppendUint32(nil, crc32c.Zeros(n))
	case BLAKE3:
		h := blake3.New(32, nil)
		for left := n; left > 0; {
			p := zeroBlock[:min(int64(len(zeroBlock)), left)]
			h.Write(p)
			left -= int64(len(p))
		}
		d = h.Sum(nil)
	default:
		panic(fmt.Sprintf("chunker: ZeroDigest of %v", alg))
	}
	zeroSums.Store(k, d)
	return d
}
