package initiator

// Registered (pinned) memory: what a copy registers with the device, by
// the rules the copy itself follows. rdmacp doctor holds the locked-memory
// limit against these figures, so a change to how much a pull or a push
// stages belongs here.

// pullSpare is how many staging slots a pull keeps beyond those its READs
// in flight fill, for chunks being checked and written: two, or one per
// verifier when writes go direct, since an O_DIRECT write holds its slot
// until the disk has the data (with only two spare, four direct writes in
// flight left the READs half their slots; bench/ab.sh measured about
// 1.13x the throughput with the extra two, for 8 MiB more staging at the
// defaults).
func pullSpare(direct bool) int {
	if direct {
		return max(2, verifiers)
	}
	return 2
}

// PullSlots is how many chunk-sized staging slots a pull of a file of
// chunks chunks of chunkSize bytes registers: enough for the READs in
// flight (qps data QPs, depth READs each, readSize bytes a READ, cut to
// the chunk), rounded up to whole chunks, and the spare ones for chunks
// being checked and written (two, or one per verifier when direct, as
// with O_DIRECT landing), never more than the file has chunks.
//
// A fetch's setup calls it with len(s.data), s.reads, f.readSize,
// layout.ChunkSize, layout.Chunks() and out.directOn().
func PullSlots(qps, depth, readSize int, chunkSize int64, chunks int, direct bool) int {
	if chunkSize <= 0 || chunks <= 0 {
		return 0
	}
	rs := min(int64(readSize), chunkSize)
	inflight := int64(qps) * int64(depth) * rs
	slots := (inflight+chunkSize-1)/chunkSize + int64(pullSpare(direct))
	return int(min(slots, int64(chunks)))
}

// PullStaging is the bytes of registered staging a pull uses: PullSlots
// chunks of chunkSize bytes, in one registration that lives as long as
// the file's transfer. Pass chunks as math.MaxInt for a file of any size.
// A pull that lands in the file's own pages (landmap.go) registers no
// more: maxLandRegions regions of landSpan bytes at a time.
func PullStaging(qps, depth, readSize int, chunkSize int64, chunks int, direct bool) int64 {
	return int64(PullSlots(qps, depth, readSize, chunkSize, chunks, direct)) * chunkSize
}

// pushWindows is how many windows of its source a push keeps registered
// at once (upload.run): one with the target, one ready, one being
// prepared.
const pushWindows = 3

// pushWindowSize is the most bytes of one push window: whole chunks, at
// most window (PutOptions.Window; 0 for its default) and at least one
// chunk. (upload.windowSize also keeps a window's digests within one
// PushWindow message, which only ever makes it smaller.)
func pushWindowSize(window, chunkSize int64) int64 {
	if window <= 0 {
		window = defaultPushWindow
	}
	if chunkSize <= 0 {
		return window
	}
	return max(window/chunkSize, 1) * chunkSize
}

// PushPinned is the most bytes of its source a push registers at once:
// three windows (one with the target, one ready, one being prepared) of
// window bytes (PutOptions.Window; 0 for its default of 32 MiB), each
// whole chunks of chunkSize and at least one.
func PushPinned(window, chunkSize int64) int64 {
	return pushWindows * pushWindowSize(window, chunkSize)
}

// landSpan is the bytes of one region of a mapped landing: the staging
// budget of slots chunks split among maxLandRegions regions, whole
// chunks, at least one.
func landSpan(slots int, chunkSize int64) int64 {
	return int64(max(1, slots/maxLandRegions)) * chunkSize
}
