package protocol

import (
	"fmt"
	"io/fs"
)

// Messages about files: listing, stat, open, chunk digests, extents, close.

// List asks for the entries of a directory, one page at a time. Cookie is 0
// for the first page and the previous reply's NextCookie after that.
type List struct {
	RequestID uint32
	Cookie    uint64
	Path      string
}

// ListReply is one page of a directory listing. NextCookie is 0 on the last
// page. The encoder does not split pages itself: the target must keep the
// reply within MaxMessage, which ListReplyOverhead and EntrySize measure.
type ListReply struct {
	RequestID  uint32
	NextCookie uint64
	Entries    []Entry
}

// FileType is the type of a directory entry. Receivers treat values they
// do not know as FileOther.
type FileType uint8

// File types.
const (
	FileRegular  FileType = 1
	FileDir      FileType = 2
	FileSymlink  FileType = 3
	FileBlockDev FileType = 4
	FileOther    FileType = 5 // a type the sender has no name for
	FileFIFO     FileType = 6
	FileSocket   FileType = 7
	FileCharDev  FileType = 8
)

// FileTypeOf is the FileType of a file whose mode (or fs.DirEntry's
// Type) is m: what a local file is called beside the entries a target
// sends. The target, which has the raw st_mode, maps it alike
// (target.modeEntry).
func FileTypeOf(m fs.FileMode) FileType {
	switch {
	case m.IsRegular():
		return FileRegular
	case m.IsDir():
		return FileDir
	case m&fs.ModeSymlink != 0:
		return FileSymlink
	case m&fs.ModeNamedPipe != 0:
		return FileFIFO
	case m&fs.ModeSocket != 0:
		return FileSocket
	case m&fs.ModeCharDevice != 0:
		return FileCharDev
	case m&fs.ModeDevice != 0:
		return FileBlockDev
	}
	return FileOther
}

func (t FileType) String() string {
	switch t {
	case FileRegular:
		return "file"
	case FileDir:
		return "dir"
	case FileSymlink:
		return "symlink"
	case FileBlockDev:
		return "blockdev"
	case FileOther:
		return "other"
	case FileFIFO:
		return "fifo"
	case FileSocket:
		return "socket"
	case FileCharDev:
		return "chardev"
	}
	return fmt.Sprintf("FileType(%d)", uint8(t))
}

// Entry describes one file. Name is the last element of its path; Target
// is a symlink's target and empty otherwise. Names are the file system's
// bytes, not necessarily UTF-8.
type Entry struct {
	Type    FileType
	Mode    uint32 // permission bits and setuid, setgid, sticky: st_mode & 07777
	Size    uint64
	MtimeNs int64 // modification time, nanoseconds since the Unix epoch
	Name    string
	Target  string
	// Meta: owner, inode and extended attributes, only for an initiator
	// that announced FeatureMeta (nil otherwise).
	Meta *Meta
}

// entryMin is the encoded size of an Entry with empty strings.
const entryMin = 1 + 4 + 8 + 8 + 2 + 2

// EntrySize is the number of bytes e takes in a ListReply.
func EntrySize(e Entry) int { return entryMin + len(e.Name) + len(e.Target) + MetaSize(e.Meta) }

// ListReplyOverhead is the size of a ListReply with no entries: a page of
// entries fits if ListReplyOverhead plus their EntrySizes is at most
// MaxMessage.
const ListReplyOverhead = HeaderSize + 8 + 4

// Stat asks for one file's entry. Symlinks are not followed.
type Stat struct {
	RequestID uint32
	Path      string
}

// StatReply answers Stat.
type StatReply struct {
	RequestID uint32
	Entry     Entry
}

// Open opens a file for reading and asks for its chunk digests' layout.
// Algorithm is a chunker.Algorithm (0 = CRC32C, 1 = BLAKE3, 2 = none);
// ChunkSize 0 lets the target choose.
type Open struct {
	RequestID uint32
	Algorithm uint8
	ChunkSize uint32
	Path      string
}

// OpenReply answers Open with a handle for the open file, the chunking the
// target chose and the whole-file digest (chunker.FileDigest).
type OpenReply struct {
	RequestID uint32
	Handle    uint32
	ChunkSize uint32
	Algorithm uint8
	Chunks    uint32
	// Flags: OpenDense, or 0.
	Flags      uint8
	FileDigest []byte
	Entry      Entry
}

// OpenDense, in OpenReply's Flags: the file had no holes when it was
// opened (one data extent from 0 to Size, as Extents would have said),
// so the initiator asks for no Extents: a round trip less before the
// first Map, 200 ms on a long link. A hole made after the Open reads as
// zeros, the file's bytes all the same.
const OpenDense uint8 = 1 << 0

// Digests asks for Count chunk digests starting at chunk First.
type Digests struct {
	RequestID uint32
	Handle    uint32
	First     uint32
	Count     uint32
}

// DigestsReply carries chunk digests from chunk First on, concatenated:
// at least one and at most the Count asked for, no more than fit
// MaxMessage (see MaxDigestsPerReply). The initiator asks again for the
// rest.
type DigestsReply struct {
	RequestID uint32
	Handle    uint32
	First     uint32
	Digests   []byte
}

// DigestsReplyOverhead is the size of a DigestsReply with no digests.
const DigestsReplyOverhead = HeaderSize + 4 + 4 + 4

// MaxDigestsPerReply is the most digests of digestSize bytes that fit one
// DigestsReply. It is unbounded (the largest uint32) for size 0.
func MaxDigestsPerReply(digestSize int) int {
	if digestSize <= 0 {
		return 1<<32 - 1
	}
	return (MaxMessage - DigestsReplyOverhead) / digestSize
}

// Close releases a handle and its windows.
type Close struct {
	RequestID uint32
	Handle    uint32
}

// CloseReply answers Close. Changed reports that the file's size or mtime
// differs from when it was opened, so what was read may be inconsistent.
type CloseReply struct {
	RequestID uint32
	Changed   bool
}

// Extents asks where an open file's data is, from file offset Offset on:
// the ranges SEEK_DATA and SEEK_HOLE find. The rest of the file is holes,
// which read as zeros.
type Extents struct {
	RequestID uint32
	Handle    uint32
	Offset    uint64
}

// ExtentsReply is one page of a file's data extents, in file order, none
// overlapping, each within the file and not empty. Next is where the
// next page starts, to ask Extents from; 0 on the last page. A block
// device, or a file system that can't say, is one extent: all data.
type ExtentsReply struct {
	RequestID uint32
	Handle    uint32
	Next      uint64
	Extents   []Extent
}

// Extent is a range of file bytes that holds data.
type Extent struct {
	Offset uint64
	Length uint64
}

// ExtentsReplyOverhead is the size of an ExtentsReply with no extents;
// each extent takes ExtentSize more.
const (
	ExtentsReplyOverhead = HeaderSize + 4 + 8 + 4
	ExtentSize           = 16
)

// MaxExtentsPerReply is the most extents one ExtentsReply holds.
const MaxExtentsPerReply = (MaxMessage - ExtentsReplyOverhead) / ExtentSize

// Closed answers Close: CloseReply's Changed, and the whole-file digest
// (chunker.FileDigest) of the chunk digests the target computed, which
// Open no longer carries. FileDigest is empty when the target did not
// compute every chunk's digest (the initiator stopped early).
type Closed struct {
	RequestID  uint32
	Changed    bool
	FileDigest []byte
}

// Suspect reports chunk Chunk of an open file, which failed its digest
// on every read: the target forgets the digests it stored for the file,
// hashes the chunk again from the file and answers DigestsReply with that
// one digest.
type Suspect struct {
	RequestID uint32
	Handle    uint32
	Chunk     uint32
}

func (m *List) Type() Type { return TypeList }

func (m *List) ID() uint32 { return m.RequestID }

func (m *List) SetID(id uint32) { m.RequestID = id }

func (m *ListReply) Type() Type { return TypeListReply }

func (m *ListReply) ID() uint32 { return m.RequestID }

func (m *ListReply) SetID(id uint32) { m.RequestID = id }

func (m *Stat) Type() Type { return TypeStat }

func (m *Stat) ID() uint32 { return m.RequestID }

func (m *Stat) SetID(id uint32) { m.RequestID = id }

func (m *StatReply) Type() Type { return TypeStatReply }

func (m *StatReply) ID() uint32 { return m.RequestID }

func (m *StatReply) SetID(id uint32) { m.RequestID = id }

func (m *Open) Type() Type { return TypeOpen }

func (m *Open) ID() uint32 { return m.RequestID }

func (m *Open) SetID(id uint32) { m.RequestID = id }

func (m *OpenReply) Type() Type { return TypeOpenReply }

func (m *OpenReply) ID() uint32 { return m.RequestID }

func (m *OpenReply) SetID(id uint32) { m.RequestID = id }

func (m *Digests) Type() Type { return TypeDigests }

func (m *Digests) ID() uint32 { return m.RequestID }

func (m *Digests) SetID(id uint32) { m.RequestID = id }

func (m *DigestsReply) Type() Type { return TypeDigestsReply }

func (m *DigestsReply) ID() uint32 { return m.RequestID }

func (m *DigestsReply) SetID(id uint32) { m.RequestID = id }

func (m *Close) Type() Type { return TypeClose }

func (m *Close) ID() uint32 { return m.RequestID }

func (m *Close) SetID(id uint32) { m.RequestID = id }

func (m *CloseReply) Type() Type { return TypeCloseReply }

func (m *CloseReply) ID() uint32 { return m.RequestID }

func (m *CloseReply) SetID(id uint32) { m.RequestID = id }

func (m *Extents) Type() Type { return TypeExtents }

func (m *Extents) ID() uint32 { return m.RequestID }

func (m *Extents) SetID(id uint32) { m.RequestID = id }

func (m *ExtentsReply) Type() Type { return TypeExtentsReply }

func (m *ExtentsReply) ID() uint32 { return m.RequestID }

func (m *ExtentsReply) SetID(id uint32) { m.RequestID = id }

func (m *Closed) Type() Type { return TypeClosed }

func (m *Closed) ID() uint32 { return m.RequestID }

func (m *Closed) SetID(id uint32) { m.RequestID = id }

func (m *Suspect) Type() Type { return TypeSuspect }

func (m *Suspect) ID() uint32 { return m.RequestID }

func (m *Suspect) SetID(id uint32) { m.RequestID = id }

func (m *List) encode(e *encoder) {
	e.u64(m.Cookie)
	e.str(m.Path)
}

func (m *List) decode(d *decoder) {
	m.Cookie = d.u64()
	m.Path = d.str()
}

func (m *ListReply) encode(e *encoder) {
	e.u64(m.NextCookie)
	e.count(len(m.Entries))
	for i := range m.Entries {
		encodeEntry(e, &m.Entries[i])
	}
}

func (m *ListReply) decode(d *decoder) {
	m.NextCookie = d.u64()
	n := d.count(entryMin)
	if n == 0 {
		return
	}
	m.Entries = make([]Entry, n)
	for i := range m.Entries {
		decodeEntry(d, &m.Entries[i])
	}
}

func encodeEntry(e *encoder, x *Entry) {
	e.u8(uint8(x.Type))
	e.u32(x.Mode)
	e.u64(x.Size)
	e.i64(x.MtimeNs)
	e.str(x.Name)
	e.str(x.Target)
	if e.meta {
		encodeMeta(e, x.Meta)
	}
}

func decodeEntry(d *decoder, x *Entry) {
	x.Type = FileType(d.u8())
	x.Mode = d.u32()
	x.Size = d.u64()
	x.MtimeNs = d.i64()
	x.Name = d.str()
	x.Target = d.str()
	if len(x.Name) > MaxName {
		d.failCap(&CapError{What: "name", Got: len(x.Name), Cap: MaxName})
	}
	if len(x.Target) > MaxPath {
		d.failCap(&CapError{What: "symlink target", Got: len(x.Target), Cap: MaxPath})
	}
	if d.meta {
		x.Meta = decodeMeta(d)
	}
}

func (m *Stat) encode(e *encoder) { e.str(m.Path) }

func (m *Stat) decode(d *decoder) { m.Path = d.str() }

func (m *StatReply) encode(e *encoder) { encodeEntry(e, &m.Entry) }

func (m *StatReply) decode(d *decoder) { decodeEntry(d, &m.Entry) }

func (m *Open) encode(e *encoder) {
	e.u8(m.Algorithm)
	e.u32(m.ChunkSize)
	e.str(m.Path)
}

func (m *Open) decode(d *decoder) {
	m.Algorithm = d.u8()
	m.ChunkSize = d.u32()
	m.Path = d.str()
}

func (m *OpenReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.ChunkSize)
	e.u8(m.Algorithm)
	e.u32(m.Chunks)
	e.u8(m.Flags)
	e.blob(m.FileDigest)
	encodeEntry(e, &m.Entry)
}

func (m *OpenReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.ChunkSize = d.u32()
	m.Algorithm = d.u8()
	m.Chunks = d.u32()
	m.Flags = d.u8()
	m.FileDigest = d.blob()
	decodeEntry(d, &m.Entry)
}

func (m *Digests) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.First)
	e.u32(m.Count)
}

func (m *Digests) decode(d *decoder) {
	m.Handle = d.u32()
	m.First = d.u32()
	m.Count = d.u32()
}

func (m *DigestsReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.First)
	e.blob(m.Digests)
}

func (m *DigestsReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.First = d.u32()
	m.Digests = d.blob()
}

func (m *Close) encode(e *encoder) { e.u32(m.Handle) }

func (m *Close) decode(d *decoder) { m.Handle = d.u32() }

func (m *CloseReply) encode(e *encoder) { e.bool(m.Changed) }

func (m *CloseReply) decode(d *decoder) { m.Changed = d.bool() }

func (m *Extents) encode(e *encoder) {
	e.u32(m.Handle)
	e.u64(m.Offset)
}

func (m *Extents) decode(d *decoder) {
	m.Handle = d.u32()
	m.Offset = d.u64()
}

func (m *ExtentsReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u64(m.Next)
	e.count(len(m.Extents))
	for _, x := range m.Extents {
		e.u64(x.Offset)
		e.u64(x.Length)
	}
}

func (m *ExtentsReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.Next = d.u64()
	n := d.count(ExtentSize)
	if n == 0 {
		return
	}
	m.Extents = make([]Extent, n)
	for i := range m.Extents {
		m.Extents[i] = Extent{Offset: d.u64(), Length: d.u64()}
	}
}

func (m *Closed) encode(e *encoder) {
	e.bool(m.Changed)
	e.blob(m.FileDigest)
}

func (m *Closed) decode(d *decoder) {
	m.Changed = d.bool()
	m.FileDigest = d.blob()
}

func (m *Suspect) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.Chunk)
}

func (m *Suspect) decode(d *decoder) {
	m.Handle = d.u32()
	m.Chunk = d.u32()
}
