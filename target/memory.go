package target

import "math"

// Registered (pinned) memory: what a target registers with the device, by
// the rules its sessions follow. rdmacp doctor holds the locked-memory
// limit against these figures, so a change to how much a session maps or
// stages belongs here.

// pushReadLen is the bytes of one of the target's READs of a pushed file
// of chunks of cs bytes: pushReadSize, cut to the chunk and to the
// device's largest message (where cfg has a device).
func pushReadLen(cfg *Config, cs int64) int {
	n := min(int64(pushReadSize), cs)
	if cfg.Device != nil {
		n = min(n, int64(min(cfg.Device.Caps().MaxMsgSize, 1<<30)))
	}
	return int(n)
}

// pushSlots is how many chunk-sized staging slots a push takes: enough for
// the READs in flight (qps data QPs, depth READs each of readSize bytes)
// rounded up to whole chunks, and one more, within one window (maxWindow)
// and the file's chunks (at least one). A push whose chunk is larger than
// the window is refused (pushFile), so it takes none.
//
// pushSetup calls it with len(p.qps), p.depth, p.readSize,
// p.layout.ChunkSize, p.layout.Chunks() and cfg.MaxWindow.
func pushSlots(qps, depth, readSize int, cs int64, chunks int, maxWindow uint64) int {
	if cs <= 0 {
		return 0
	}
	inflight := int64(qps) * int64(depth) * int64(readSize)
	return int(min((inflight+cs-1)/cs+1, int64(min(maxWindow, 1<<62))/cs, int64(max(chunks, 1))))
}

// PushStaging is the bytes of registered staging, reserved in the window
// budget, that a target configured as cfg (its defaults filled in as New
// does) takes for one file pushed to it in chunks of chunkSize bytes (0:
// cfg.ChunkSize), chunks of them, READ over qps data QPs each depth deep
// (the session's data QPs, and cfg.PushDepth capped by what each
// connection negotiated). Pass chunks as math.MaxInt for a file of any
// size. A device in cfg cuts the READs to its largest message.
func PushStaging(cfg Config, qps, depth int, chunkSize int64, chunks int) uint64 {
	cfg.setDefaults()
	cs := chunkSize
	if cs == 0 {
		cs = cfg.ChunkSize
	}
	if cs <= 0 || uint64(cs) > cfg.MaxWindow {
		return 0
	}
	return uint64(pushSlots(qps, depth, pushReadLen(&cfg, cs), cs, chunks, cfg.MaxWindow)) * uint64(cs)
}

// SessionMemory is what one session of a target may have registered at
// once.
type SessionMemory struct {
	Windows int    // windows mapped at once (Config.MaxWindowsPerSession)
	Window  uint64 // the most bytes one maps (Config.MaxWindow)
	// Push is the staging of one pushed file, as large as a push of a
	// file of Config.ChunkSize chunks over Config.MaxDataQPs data QPs,
	// Config.PushDepth deep, can take (PushStaging). An rdmacp initiator
	// pushes one file at a time; each further push in flight takes its
	// own staging, within the budget.
	Push uint64
	// Total is Windows×Window plus Push, within Config.WindowBudget
	// (every window and every push's staging is reserved in it).
	Total uint64
}

// SessionPinned reports what one session of a target configured as cfg
// (its defaults filled in as New does) may have registered at once: its
// windows, file mappings or their bounce buffers (Map, Pack and Walk
// windows alike count against MaxWindowsPerSession and are at most
// MaxWindow each), and a push's staging; all of it within the window
// budget, which bounds every session together.
func SessionPinned(cfg Config) SessionMemory {
	cfg.setDefaults()
	m := SessionMemory{
		Windows: cfg.MaxWindowsPerSession,
		Window:  cfg.MaxWindow,
		Push:    PushStaging(cfg, cfg.MaxDataQPs, cfg.PushDepth, cfg.ChunkSize, math.MaxInt),
	}
	m.Total = min(uint64(max(m.Windows, 0))*m.Window+m.Push, cfg.WindowBudget)
	return m
}
