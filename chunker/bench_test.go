package chunker

import (
	"context"
	"testing"
)

func BenchmarkSum(b *testing.B) {
	p := make([]byte, 4<<20)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for _, alg := range []Algorithm{CRC32C, BLAKE3} {
		b.Run(alg.String(), func(b *testing.B) {
			dst := make([]byte, 0, 32)
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				dst = AppendSum(dst[:0], alg, p)
			}
		})
	}
}

func BenchmarkHashFile(b *testing.B) {
	const size = 32 << 20
	f, _ := tempFile(b, size, 9)
	l := Layout{Size: size, ChunkSize: DefaultChunkSize}
	for _, alg := range []Algorithm{CRC32C, BLAKE3} {
		b.Run(alg.String(), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if _, err := HashFile(context.Background(), f, l, alg, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkFileDigestCRC32C(b *testing.B) {
	// 1 TiB in 4 MiB chunks: 262144 chunk CRCs to combine.
	l := Layout{Size: 1 << 40, ChunkSize: DefaultChunkSize}
	d, err := MakeDigests(CRC32C, l.Chunks(), make([]byte, 4*l.Chunks()))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := FileDigest(CRC32C, l, d); err != nil {
			b.Fatal(err)
		}
	}
}
