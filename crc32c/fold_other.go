//go:build !amd64

package crc32c

const hasFold = false

func castagnoliFold(crc uint32, p []byte) uint32 { panic("castagnoliFold: amd64 only") }
