package chunker

import (
	"fmt"
)

// blake3ListLabel starts the input of a BLAKE3 file digest.
const blake3ListLabel = "rdmacp-blake3-list-v1"

// FileDigest derives the whole-file digest from the chunk digests d of a
// file laid out as l:
//
//   - CRC32C: the CRC-32C of the whole file (4 bytes, big-endian), combined
//     from the chunk CRCs.
//   - BLAKE3: BLAKE3-256 of "rdmacp-blake3-list-v1" ‖ chunk size (8 bytes,
//     big-endian) ‖ file size (8 bytes, big-endian) ‖ the chunk digests.
//   - None: empty.
func FileDigest(alg Algorithm, l Layout, d Digests) ([]byte, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if d.Algorithm() != alg {
		return nil, fmt.Errorf("chunker: file digest: digests are %s, not %s", d.Algorithm(), alg)
	}
	if d.Len() != l.Chunks() {
		return nil, fmt.Errorf("chunker: file digest: %d digests for %d chunks", d.Len(), l.Chunks())
	}
	fd, err := NewFileDigester(alg, l)
	if err != nil {
		return nil, err
	}
	if err := fd.Add(d.Bytes()); err != nil {
		return nil, err
	}
	return fd.Sum()
}
