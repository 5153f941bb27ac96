package protocol

// Messages for trees: Walk, and Pack (many small files in one window).

// Pack asks the target to copy whole small files into one window, so
// that one round trip and a few READs move many of them. Algorithm is as
// in Open. The target answers PackReply for a prefix of Paths (at least
// one): the initiator asks again for the rest.
type Pack struct {
	RequestID uint32
	Algorithm uint8
	Paths     []string
}

// PackReply answers Pack. Files[i] answers Paths[i]; there may be fewer
// Files than Paths, never more. Handle is closed with Close, which frees
// the window; Window.Offset is 0 and Window.Length the bytes packed
// (0, with no keys needed, when every packed file is empty or failed).
type PackReply struct {
	RequestID uint32
	Handle    uint32
	Window    Window
	Files     []PackedFile
}

// PackedFile is one file of a PackReply. Code 0 means the file's
// Entry.Size bytes are at Offset in the window, with digest Digest
// (chunker.Sum over the whole file, empty for algorithm none); any other
// Code says, with Message, why the file was not packed (CodeTooMany: too
// large to pack, to be copied with Open instead).
type PackedFile struct {
	Code    Code
	Offset  uint64
	Digest  []byte
	Entry   Entry
	Message string
}

// packedMin is the encoded size of a PackedFile with empty strings and digest.
const packedMin = 2 + 8 + 4 + entryMin + 2

// PackedFileSize is the number of bytes f takes in a PackReply.
func PackedFileSize(f PackedFile) int {
	return packedMin + len(f.Digest) + len(f.Entry.Name) + len(f.Entry.Target) + MetaSize(f.Entry.Meta) + len(f.Message)
}

// PackReplyOverhead is the size of a PackReply with no files, whose
// window has keys for qps data QPs.
func PackReplyOverhead(qps int) int { return HeaderSize + 4 + 4 + 8 + 8 + 8 + 4 + 4*qps + 4 }

// PackSize is the size of a Pack carrying paths.
func PackSize(paths []string) int {
	n := HeaderSize + 1 + 4
	for _, p := range paths {
		n += 2 + len(p)
	}
	return n
}

// Walk asks the target to walk the directory Path and send everything
// under it, a batch at a time: the first WalkBatch answers Walk, the
// others WalkNext. Regular files of at most PackMax bytes come with their
// bytes packed into their batch's window, as Pack packs them (PackMax 0:
// none are). With ShardN above 1 only directories, and the other entries
// whose path (Path, "/", and the entry's path under Path) hashes with
// 32-bit FNV-1a to ShardI modulo ShardN, are sent. MaxEntries caps the
// first batch (0: the target's limit). Algorithm is as in Open.
type Walk struct {
	RequestID  uint32
	Algorithm  uint8
	MaxEntries uint16
	ShardI     uint32
	ShardN     uint32
	PackMax    uint64
	Path       string
	// Rules are the initiator's include and exclude rules (rsync's, see
	// package filter), first match wins: the target neither sends nor
	// opens, stats or descends into what they exclude. At most MaxRules.
	Rules []WalkRule
}

// WalkRule is one include or exclude rule of a Walk.
type WalkRule struct {
	Include bool
	Pattern string // at most MaxPath bytes
}

// MaxRules bounds a Walk's rules: rsync users' --exclude-from lists run
// to dozens, and each rule is tried on every name the target walks.
const MaxRules = 1024

// WalkNext asks for a walk's next batch, capped at MaxEntries (0: the
// target's limit). Release is the window of an earlier batch that the
// initiator is done with (0: none), which the target frees.
type WalkNext struct {
	RequestID  uint32
	Handle     uint32
	Release    uint32
	MaxEntries uint16
}

// WalkBatch is a batch of a walk's entries. Handle is the walk, closed
// with Close, which frees the windows it still has. Done: no batch
// follows. Window holds the batch's packed files (Length 0, with no keys
// needed, when there are none); it stays until released or closed.
type WalkBatch struct {
	RequestID uint32
	Handle    uint32
	Done      bool
	Window    Window
	Entries   []WalkEntry
}

// WalkEntry is one entry of a walk. Dir is the directory it is in: 0 for
// the walk's root, k for the k-th entry of type FileDir that the walk
// sent, counting from 1. The walk is depth first: a directory's entry is
// followed by everything under it, then by the next entry of its own
// directory. Packed: Entry.Size bytes of the file are at Offset in the
// batch's window, with Digest as in a PackedFile. A Code other than 0
// says, with Message, why the entry could not be read.
type WalkEntry struct {
	Dir    uint32
	Packed bool
	PackedFile
}

// walkEntryMin is the encoded size of a WalkEntry with empty strings and digest.
const walkEntryMin = 4 + 1 + packedMin

// WalkEntrySize is the number of bytes e takes in a WalkBatch.
func WalkEntrySize(e *WalkEntry) int { return 4 + 1 + PackedFileSize(e.PackedFile) }

// WalkBatchOverhead is the size of a WalkBatch with no entries, whose
// window has keys for qps data QPs.
func WalkBatchOverhead(qps int) int { return HeaderSize + 4 + 1 + 4 + 8 + 8 + 8 + 4 + 4*qps + 4 }

func (m *Pack) Type() Type { return TypePack }

func (m *Pack) ID() uint32 { return m.RequestID }

func (m *Pack) SetID(id uint32) { m.RequestID = id }

func (m *PackReply) Type() Type { return TypePackReply }

func (m *PackReply) ID() uint32 { return m.RequestID }

func (m *PackReply) SetID(id uint32) { m.RequestID = id }

func (m *Walk) Type() Type { return TypeWalk }

func (m *Walk) ID() uint32 { return m.RequestID }

func (m *Walk) SetID(id uint32) { m.RequestID = id }

func (m *WalkNext) Type() Type { return TypeWalkNext }

func (m *WalkNext) ID() uint32 { return m.RequestID }

func (m *WalkNext) SetID(id uint32) { m.RequestID = id }

func (m *WalkBatch) Type() Type { return TypeWalkBatch }

func (m *WalkBatch) ID() uint32 { return m.RequestID }

func (m *WalkBatch) SetID(id uint32) { m.RequestID = id }

func (m *Pack) encode(e *encoder) {
	e.u8(m.Algorithm)
	e.count(len(m.Paths))
	for _, p := range m.Paths {
		e.str(p)
	}
}

func (m *Pack) decode(d *decoder) {
	m.Algorithm = d.u8()
	n := d.count(2)
	if n == 0 {
		return
	}
	m.Paths = make([]string, n)
	for i := range m.Paths {
		m.Paths[i] = d.str()
	}
}

func (m *PackReply) encode(e *encoder) {
	e.u32(m.Handle)
	encodeWindow(e, &m.Window)
	e.count(len(m.Files))
	for i := range m.Files {
		encodePacked(e, &m.Files[i])
	}
}

func encodePacked(e *encoder, f *PackedFile) {
	e.u16(uint16(f.Code))
	e.u64(f.Offset)
	e.blob(f.Digest)
	encodeEntry(e, &f.Entry)
	e.str(f.Message)
}

func decodePacked(d *decoder, f *PackedFile) {
	f.Code = Code(d.u16())
	f.Offset = d.u64()
	f.Digest = d.blob()
	decodeEntry(d, &f.Entry)
	f.Message = d.str()
}

func (m *PackReply) decode(d *decoder) {
	m.Handle = d.u32()
	decodeWindow(d, &m.Window)
	n := d.count(packedMin)
	if n > MaxBatchEntries {
		d.failCap(&CapError{What: "entries", Got: n, Cap: MaxBatchEntries})
	}
	if n == 0 || d.err != nil {
		return
	}
	m.Files = make([]PackedFile, n)
	for i := range m.Files {
		decodePacked(d, &m.Files[i])
	}
}

func (m *Walk) encode(e *encoder) {
	e.u8(m.Algorithm)
	e.u16(m.MaxEntries)
	e.u32(m.ShardI)
	e.u32(m.ShardN)
	e.u64(m.PackMax)
	e.str(m.Path)
	e.u16(uint16(len(m.Rules)))
	for _, r := range m.Rules {
		include := uint8(0)
		if r.Include {
			include = 1
		}
		e.u8(include)
		e.str(r.Pattern)
	}
}

func (m *Walk) decode(d *decoder) {
	m.Algorithm = d.u8()
	m.MaxEntries = d.u16()
	m.ShardI = d.u32()
	m.ShardN = d.u32()
	m.PackMax = d.u64()
	m.Path = d.str()
	n := int(d.u16())
	if n > MaxRules {
		d.failCap(&CapError{What: "rules", Got: n, Cap: MaxRules})
		return
	}
	for range n {
		r := WalkRule{}
		switch d.u8() {
		case 0:
		case 1:
			r.Include = true
		default:
			d.fail("walk rule: include byte not 0 or 1")
		}
		r.Pattern = d.str()
		if len(r.Pattern) > MaxPath {
			d.failCap(&CapError{What: "rule", Got: len(r.Pattern), Cap: MaxPath})
		}
		if d.err != nil {
			return
		}
		m.Rules = append(m.Rules, r)
	}
}

func (m *WalkNext) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.Release)
	e.u16(m.MaxEntries)
}

func (m *WalkNext) decode(d *decoder) {
	m.Handle = d.u32()
	m.Release = d.u32()
	m.MaxEntries = d.u16()
}

func (m *WalkBatch) encode(e *encoder) {
	e.u32(m.Handle)
	e.bool(m.Done)
	encodeWindow(e, &m.Window)
	e.count(len(m.Entries))
	for i := range m.Entries {
		w := &m.Entries[i]
		e.u32(w.Dir)
		e.bool(w.Packed)
		encodePacked(e, &w.PackedFile)
	}
}

func (m *WalkBatch) decode(d *decoder) {
	m.Handle = d.u32()
	m.Done = d.bool()
	decodeWindow(d, &m.Window)
	n := d.count(walkEntryMin)
	if n > MaxBatchEntries {
		d.failCap(&CapError{What: "entries", Got: n, Cap: MaxBatchEntries})
	}
	if n == 0 || d.err != nil {
		return
	}
	m.Entries = make([]WalkEntry, n)
	for i := range m.Entries {
		w := &m.Entries[i]
		w.Dir = d.u32()
		w.Packed = d.bool()
		decodePacked(d, &w.PackedFile)
	}
}
