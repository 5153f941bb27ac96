package protocol

import "fmt"

// Hello opens a session: the initiator's first message.
type Hello struct {
	RequestID  uint32
	MinVersion uint8 // lowest and highest protocol versions the initiator speaks
	MaxVersion uint8
	// ClientNonce is 32 random bytes, which the target's AuthOK MAC covers.
	ClientNonce [32]byte
	// Client is the software and version, e.g. "rdmacp/0.1", then the
	// features the initiator understands (ClientString, HasFeature).
	Client string
}

// Challenge answers Hello.
type Challenge struct {
	RequestID uint32
	Version   uint8 // the version chosen for the rest of the session
	// ServerNonce is 32 random bytes, which the initiator's Auth MAC covers.
	ServerNonce  [32]byte
	AuthRequired bool
	// Session identifies the session to data QPs joining it. The target
	// accepts it only once the control QP has authenticated, or at once
	// when AuthRequired is false.
	Session       [16]byte
	MaxDataQPs    uint16 // data QPs the target accepts per session
	MaxReadsPerQP uint16 // RDMA READs in flight per data QP the target allows
	MaxWindow     uint64 // largest window the target maps, in bytes
	Server        string // software and version, e.g. "rdmacp/0.1"
	// RateCap is the bytes per second the target caps the session's
	// READs at, over all its data QPs together (serve --bwlimit); 0:
	// none. The initiator must post its READs within it.
	RateCap uint64
	// Rails is how many data addresses the target tells in RailsReply
	// (at most MaxRailAddrs); 0: none, so the initiator asks no Rails and
	// sends no RailDrop, and its data QPs join at the address it dialled.
	Rails uint8
}

// Auth proves the initiator knows the shared secret. MAC is ClientMAC.
type Auth struct {
	RequestID uint32
	MAC       [32]byte
}

// AuthOK accepts Auth and proves the target knows the secret too. MAC is
// ServerMAC.
type AuthOK struct {
	RequestID uint32
	MAC       [32]byte
	// RateCap is the bytes per second the target caps the session at
	// now that it knows who it is (the lower of serve's cap and the
	// identity's); 0: none. It replaces Challenge.RateCap.
	RateCap uint64
}

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
	FileOther    FileType = 5
)

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
	RequestID  uint32
	Handle     uint32
	ChunkSize  uint32
	Algorithm  uint8
	Chunks     uint32
	FileDigest []byte
	Entry      Entry
}

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

// Map asks the target to map file bytes [Offset, Offset+Length) of an open
// file for RDMA READ.
type Map struct {
	RequestID uint32
	Handle    uint32
	Offset    uint64
	Length    uint64
}

// MapReply answers Map with the window the target mapped.
type MapReply struct {
	RequestID uint32
	Handle    uint32
	Window    Window
}

// Window is a mapped range of a file. File offset Offset is at remote
// address Addr; the range is Length bytes long, which may be less than was
// asked for (never more than Challenge.MaxWindow). RKeys holds the remote
// key for each data QP, indexed by data QP index.
type Window struct {
	ID     uint32
	Offset uint64
	Length uint64
	Addr   uint64
	RKeys  []uint32
}

// Unmap releases a window. The target answers Ack.
type Unmap struct {
	RequestID uint32
	Handle    uint32
	WindowID  uint32
}

// Ack is the empty reply.
type Ack struct {
	RequestID uint32
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

// Code is an error code in an Error message.
type Code uint16

// Error codes.
const (
	CodeNotFound    Code = 1  // no such file or directory
	CodePermission  Code = 2  // permission denied, or outside the export
	CodeNotDir      Code = 3  // List of something that is not a directory
	CodeIsDir       Code = 4  // Open of a directory
	CodeAuthFailed  Code = 5  // bad Auth MAC, or a request before Auth
	CodeVersion     Code = 6  // no common protocol version
	CodeBadRequest  Code = 7  // malformed or out-of-place request, bad handle or range
	CodeChanged     Code = 8  // the file changed under an operation
	CodeTooMany     Code = 9  // too many handles, windows or sessions
	CodeInternal    Code = 10 // the target failed
	CodeUnsupported Code = 11 // unknown message type, algorithm or option
	CodeReadOnly    Code = 12 // a push to an export that is not writable
	CodeVerify      Code = 13 // a pushed chunk kept failing its digest
	CodeNoSpace     Code = 14 // the target's file system is full
)

var codeNames = [...]string{
	CodeNotFound:    "not found",
	CodePermission:  "permission denied",
	CodeNotDir:      "not a directory",
	CodeIsDir:       "is a directory",
	CodeAuthFailed:  "authentication failed",
	CodeVersion:     "version mismatch",
	CodeBadRequest:  "bad request",
	CodeChanged:     "file changed",
	CodeTooMany:     "too many",
	CodeInternal:    "internal error",
	CodeUnsupported: "unsupported",
	CodeReadOnly:    "read-only export",
	CodeVerify:      "verification failed",
	CodeNoSpace:     "no space left on the target",
}

func (c Code) String() string {
	if int(c) < len(codeNames) && codeNames[c] != "" {
		return codeNames[c]
	}
	return fmt.Sprintf("error code %d", uint16(c))
}

// Error answers a request that failed. It is a Go error too.
type Error struct {
	RequestID uint32
	Code      Code
	Message   string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "remote error: " + e.Code.String()
	}
	return "remote error: " + e.Code.String() + ": " + e.Message
}

// Bye ends the session; either side may send it. It has no reply.
type Bye struct {
	RequestID uint32
}

// Working says the target is still serving request RequestID: it comes
// WorkingInterval after the target began, and every WorkingInterval after
// that, until the reply. It has no body and no reply. It lets an
// initiator tell a target that is slow (hashing a large file for Open)
// from one that is gone, without a timeout longer than any request.
//
// Progress counts the work done for the request so far (bytes hashed or
// read, directory entries walked), from the code doing it: a keepalive
// proves the target alive, not that the request moves, and a target
// whose storage hangs goes on sending Working. The initiator fails a
// request whose Progress has not grown for its I/O timeout
// (NoProgressError). Only a change matters, not the unit.
type Working struct {
	RequestID uint32
	Progress  uint64
}

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

// Push asks the target to take a file from the initiator: the target
// pulls it with RDMA READs from windows the initiator registers (see
// PushWindow) into a temporary file, and renames it to Path on
// PushCommit. If Path is a directory the file goes inside it as Name.
// Algorithm and ChunkSize are as in Open; Retries bounds the re-reads of
// a chunk that fails its digest. Mode and MtimeNs are the source's.
type Push struct {
	RequestID uint32
	Algorithm uint8
	ChunkSize uint32
	Retries   uint8
	Size      uint64
	Mode      uint32
	MtimeNs   int64
	Path      string
	Name      string
}

// PushReply answers Push with a handle for the push and the chunking in
// use. Path is where the file will land ("EXPORT/dir/name").
type PushReply struct {
	RequestID uint32
	Handle    uint32
	ChunkSize uint32
	Algorithm uint8
	Chunks    uint32
	Path      string
}

// PushWindow offers the next range of a pushed file for the target to
// READ: file offset Window.Offset is at the initiator's address
// Window.Addr, read on data QP i with Window.RKeys[i]. The window covers
// whole chunks and follows the previous one; Digests holds their
// digests, concatenated. The target answers once it has read, verified
// and written the window.
type PushWindow struct {
	RequestID uint32
	Handle    uint32
	Window    Window
	Digests   []byte
}

// PushWindowOverhead is the size of a PushWindow with no digests, whose
// window has keys for qps data QPs.
func PushWindowOverhead(qps int) int { return HeaderSize + 4 + 4 + 8 + 8 + 8 + 4 + 4*qps + 4 }

// PushWindowReply answers PushWindow. Retries counts the chunks read
// again after failing their digest; BytesRead is what the target READ
// for the window, retries included.
type PushWindowReply struct {
	RequestID uint32
	Handle    uint32
	Offset    uint64
	Retries   uint32
	BytesRead uint64
}

// PushCommit ends a push whose windows have all been answered: the
// target checks FileDigest (chunker.FileDigest over the chunks it
// verified), then syncs and renames the file into place and answers Ack.
// Close instead abandons the push.
type PushCommit struct {
	RequestID  uint32
	Handle     uint32
	FileDigest []byte
}

// Type, ID and SetID for each message.

func (m *Hello) Type() Type                { return TypeHello }
func (m *Hello) ID() uint32                { return m.RequestID }
func (m *Hello) SetID(id uint32)           { m.RequestID = id }
func (m *Challenge) Type() Type            { return TypeChallenge }
func (m *Challenge) ID() uint32            { return m.RequestID }
func (m *Challenge) SetID(id uint32)       { m.RequestID = id }
func (m *Auth) Type() Type                 { return TypeAuth }
func (m *Auth) ID() uint32                 { return m.RequestID }
func (m *Auth) SetID(id uint32)            { m.RequestID = id }
func (m *AuthOK) Type() Type               { return TypeAuthOK }
func (m *AuthOK) ID() uint32               { return m.RequestID }
func (m *AuthOK) SetID(id uint32)          { m.RequestID = id }
func (m *List) Type() Type                 { return TypeList }
func (m *List) ID() uint32                 { return m.RequestID }
func (m *List) SetID(id uint32)            { m.RequestID = id }
func (m *ListReply) Type() Type            { return TypeListReply }
func (m *ListReply) ID() uint32            { return m.RequestID }
func (m *ListReply) SetID(id uint32)       { m.RequestID = id }
func (m *Stat) Type() Type                 { return TypeStat }
func (m *Stat) ID() uint32                 { return m.RequestID }
func (m *Stat) SetID(id uint32)            { m.RequestID = id }
func (m *StatReply) Type() Type            { return TypeStatReply }
func (m *StatReply) ID() uint32            { return m.RequestID }
func (m *StatReply) SetID(id uint32)       { m.RequestID = id }
func (m *Open) Type() Type                 { return TypeOpen }
func (m *Open) ID() uint32                 { return m.RequestID }
func (m *Open) SetID(id uint32)            { m.RequestID = id }
func (m *OpenReply) Type() Type            { return TypeOpenReply }
func (m *OpenReply) ID() uint32            { return m.RequestID }
func (m *OpenReply) SetID(id uint32)       { m.RequestID = id }
func (m *Digests) Type() Type              { return TypeDigests }
func (m *Digests) ID() uint32              { return m.RequestID }
func (m *Digests) SetID(id uint32)         { m.RequestID = id }
func (m *DigestsReply) Type() Type         { return TypeDigestsReply }
func (m *DigestsReply) ID() uint32         { return m.RequestID }
func (m *DigestsReply) SetID(id uint32)    { m.RequestID = id }
func (m *Map) Type() Type                  { return TypeMap }
func (m *Map) ID() uint32                  { return m.RequestID }
func (m *Map) SetID(id uint32)             { m.RequestID = id }
func (m *MapReply) Type() Type             { return TypeMapReply }
func (m *MapReply) ID() uint32             { return m.RequestID }
func (m *MapReply) SetID(id uint32)        { m.RequestID = id }
func (m *Unmap) Type() Type                { return TypeUnmap }
func (m *Unmap) ID() uint32                { return m.RequestID }
func (m *Unmap) SetID(id uint32)           { m.RequestID = id }
func (m *Ack) Type() Type                  { return TypeAck }
func (m *Ack) ID() uint32                  { return m.RequestID }
func (m *Ack) SetID(id uint32)             { m.RequestID = id }
func (m *Close) Type() Type                { return TypeClose }
func (m *Close) ID() uint32                { return m.RequestID }
func (m *Close) SetID(id uint32)           { m.RequestID = id }
func (m *CloseReply) Type() Type           { return TypeCloseReply }
func (m *CloseReply) ID() uint32           { return m.RequestID }
func (m *CloseReply) SetID(id uint32)      { m.RequestID = id }
func (m *Error) Type() Type                { return TypeError }
func (m *Error) ID() uint32                { return m.RequestID }
func (m *Error) SetID(id uint32)           { m.RequestID = id }
func (m *Bye) Type() Type                  { return TypeBye }
func (m *Bye) ID() uint32                  { return m.RequestID }
func (m *Bye) SetID(id uint32)             { m.RequestID = id }
func (m *Pack) Type() Type                 { return TypePack }
func (m *Pack) ID() uint32                 { return m.RequestID }
func (m *Pack) SetID(id uint32)            { m.RequestID = id }
func (m *PackReply) Type() Type            { return TypePackReply }
func (m *PackReply) ID() uint32            { return m.RequestID }
func (m *PackReply) SetID(id uint32)       { m.RequestID = id }
func (m *Walk) Type() Type                 { return TypeWalk }
func (m *Walk) ID() uint32                 { return m.RequestID }
func (m *Walk) SetID(id uint32)            { m.RequestID = id }
func (m *WalkNext) Type() Type             { return TypeWalkNext }
func (m *WalkNext) ID() uint32             { return m.RequestID }
func (m *WalkNext) SetID(id uint32)        { m.RequestID = id }
func (m *WalkBatch) Type() Type            { return TypeWalkBatch }
func (m *WalkBatch) ID() uint32            { return m.RequestID }
func (m *WalkBatch) SetID(id uint32)       { m.RequestID = id }
func (m *Push) Type() Type                 { return TypePush }
func (m *Push) ID() uint32                 { return m.RequestID }
func (m *Push) SetID(id uint32)            { m.RequestID = id }
func (m *PushReply) Type() Type            { return TypePushReply }
func (m *PushReply) ID() uint32            { return m.RequestID }
func (m *PushReply) SetID(id uint32)       { m.RequestID = id }
func (m *PushWindow) Type() Type           { return TypePushWindow }
func (m *PushWindow) ID() uint32           { return m.RequestID }
func (m *PushWindow) SetID(id uint32)      { m.RequestID = id }
func (m *PushWindowReply) Type() Type      { return TypePushWindowReply }
func (m *PushWindowReply) ID() uint32      { return m.RequestID }
func (m *PushWindowReply) SetID(id uint32) { m.RequestID = id }
func (m *Working) Type() Type              { return TypeWorking }
func (m *Working) ID() uint32              { return m.RequestID }
func (m *Working) SetID(id uint32)         { m.RequestID = id }
func (m *PushCommit) Type() Type           { return TypePushCommit }
func (m *PushCommit) ID() uint32           { return m.RequestID }
func (m *PushCommit) SetID(id uint32)      { m.RequestID = id }
func (m *Extents) Type() Type              { return TypeExtents }
func (m *Extents) ID() uint32              { return m.RequestID }
func (m *Extents) SetID(id uint32)         { m.RequestID = id }
func (m *ExtentsReply) Type() Type         { return TypeExtentsReply }
func (m *ExtentsReply) ID() uint32         { return m.RequestID }
func (m *ExtentsReply) SetID(id uint32)    { m.RequestID = id }
func (m *Closed) Type() Type               { return TypeClosed }
func (m *Closed) ID() uint32               { return m.RequestID }
func (m *Closed) SetID(id uint32)          { m.RequestID = id }
func (m *Suspect) Type() Type              { return TypeSuspect }
func (m *Suspect) ID() uint32              { return m.RequestID }
func (m *Suspect) SetID(id uint32)         { m.RequestID = id }

// Bodies. Each encode writes the fields in wire order; each decode reads
// them back in the same order.

func (m *Hello) encode(e *encoder) {
	e.u8(m.MinVersion)
	e.u8(m.MaxVersion)
	e.raw(m.ClientNonce[:])
	e.str(m.Client)
}

func (m *Hello) decode(d *decoder) {
	m.MinVersion = d.u8()
	m.MaxVersion = d.u8()
	d.array(m.ClientNonce[:])
	m.Client = d.str()
}

func (m *Challenge) encode(e *encoder) {
	e.u8(m.Version)
	e.raw(m.ServerNonce[:])
	e.bool(m.AuthRequired)
	e.raw(m.Session[:])
	e.u16(m.MaxDataQPs)
	e.u16(m.MaxReadsPerQP)
	e.u64(m.MaxWindow)
	e.str(m.Server)
	e.u64(m.RateCap)
	e.u8(m.Rails)
}

func (m *Challenge) decode(d *decoder) {
	m.Version = d.u8()
	d.array(m.ServerNonce[:])
	m.AuthRequired = d.bool()
	d.array(m.Session[:])
	m.MaxDataQPs = d.u16()
	m.MaxReadsPerQP = d.u16()
	m.MaxWindow = d.u64()
	m.Server = d.str()
	m.RateCap = d.u64()
	if m.Rails = d.u8(); m.Rails > MaxRailAddrs {
		d.fail("Challenge.Rails %d, at most %d", m.Rails, MaxRailAddrs)
	}
}

func (m *Auth) encode(e *encoder) { e.raw(m.MAC[:]) }
func (m *Auth) decode(d *decoder) { d.array(m.MAC[:]) }
func (m *AuthOK) encode(e *encoder) {
	e.raw(m.MAC[:])
	e.u64(m.RateCap)
}

func (m *AuthOK) decode(d *decoder) {
	d.array(m.MAC[:])
	m.RateCap = d.u64()
}

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

func (m *Stat) encode(e *encoder)      { e.str(m.Path) }
func (m *Stat) decode(d *decoder)      { m.Path = d.str() }
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
	e.blob(m.FileDigest)
	encodeEntry(e, &m.Entry)
}

func (m *OpenReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.ChunkSize = d.u32()
	m.Algorithm = d.u8()
	m.Chunks = d.u32()
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

func (m *Map) encode(e *encoder) {
	e.u32(m.Handle)
	e.u64(m.Offset)
	e.u64(m.Length)
}

func (m *Map) decode(d *decoder) {
	m.Handle = d.u32()
	m.Offset = d.u64()
	m.Length = d.u64()
}

func (m *MapReply) encode(e *encoder) {
	e.u32(m.Handle)
	encodeWindow(e, &m.Window)
}

func encodeWindow(e *encoder, w *Window) {
	e.u32(w.ID)
	e.u64(w.Offset)
	e.u64(w.Length)
	e.u64(w.Addr)
	e.count(len(w.RKeys))
	for _, k := range w.RKeys {
		e.u32(k)
	}
}

func (m *MapReply) decode(d *decoder) {
	m.Handle = d.u32()
	decodeWindow(d, &m.Window)
}

func decodeWindow(d *decoder, w *Window) {
	w.ID = d.u32()
	w.Offset = d.u64()
	w.Length = d.u64()
	w.Addr = d.u64()
	n := d.count(4)
	if n == 0 {
		return
	}
	w.RKeys = make([]uint32, n)
	for i := range w.RKeys {
		w.RKeys[i] = d.u32()
	}
}

func (m *Unmap) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.WindowID)
}

func (m *Unmap) decode(d *decoder) {
	m.Handle = d.u32()
	m.WindowID = d.u32()
}

func (m *Ack) encode(e *encoder) {}
func (m *Ack) decode(d *decoder) {}

func (m *Close) encode(e *encoder) { e.u32(m.Handle) }
func (m *Close) decode(d *decoder) { m.Handle = d.u32() }

func (m *CloseReply) encode(e *encoder) { e.bool(m.Changed) }
func (m *CloseReply) decode(d *decoder) { m.Changed = d.bool() }

func (m *Error) encode(e *encoder) {
	e.u16(uint16(m.Code))
	e.str(m.Message)
}

func (m *Error) decode(d *decoder) {
	m.Code = Code(d.u16())
	m.Message = d.str()
}

func (m *Bye) encode(e *encoder) {}
func (m *Bye) decode(d *decoder) {}

func (m *Working) encode(e *encoder) { e.u64(m.Progress) }
func (m *Working) decode(d *decoder) { m.Progress = d.u64() }

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

func (m *Push) encode(e *encoder) {
	e.u8(m.Algorithm)
	e.u32(m.ChunkSize)
	e.u8(m.Retries)
	e.u64(m.Size)
	e.u32(m.Mode)
	e.i64(m.MtimeNs)
	e.str(m.Path)
	e.str(m.Name)
}

func (m *Push) decode(d *decoder) {
	m.Algorithm = d.u8()
	m.ChunkSize = d.u32()
	m.Retries = d.u8()
	m.Size = d.u64()
	m.Mode = d.u32()
	m.MtimeNs = d.i64()
	m.Path = d.str()
	m.Name = d.str()
}

func (m *PushReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.ChunkSize)
	e.u8(m.Algorithm)
	e.u32(m.Chunks)
	e.str(m.Path)
}

func (m *PushReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.ChunkSize = d.u32()
	m.Algorithm = d.u8()
	m.Chunks = d.u32()
	m.Path = d.str()
}

func (m *PushWindow) encode(e *encoder) {
	e.u32(m.Handle)
	encodeWindow(e, &m.Window)
	e.blob(m.Digests)
}

func (m *PushWindow) decode(d *decoder) {
	m.Handle = d.u32()
	decodeWindow(d, &m.Window)
	m.Digests = d.blob()
}

func (m *PushWindowReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u64(m.Offset)
	e.u32(m.Retries)
	e.u64(m.BytesRead)
}

func (m *PushWindowReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.Offset = d.u64()
	m.Retries = d.u32()
	m.BytesRead = d.u64()
}

func (m *PushCommit) encode(e *encoder) {
	e.u32(m.Handle)
	e.blob(m.FileDigest)
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

func (m *PushCommit) decode(d *decoder) {
	m.Handle = d.u32()
	m.FileDigest = d.blob()
}

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
