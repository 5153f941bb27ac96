module github.com/rdmacp/rdmacp

go 1.26.8

require (
	golang.org/x/sys v0.50.0
	lukechampine.com/blake3 v1.4.1
)

require github.com/klauspost/cpuid/v2 v2.0.9 // indirect
