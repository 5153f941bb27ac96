package protocol

// Messages of a push: the target READs a file from the initiator.

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
	// Token names this push across sessions: random, made by the
	// initiator for one file and sent again, unchanged, when it pushes
	// the file again on a new session after losing one. A target that
	// kept the lost session's push (the same identity, token, path and
	// source) goes on from what it verified: see PushReply.Resumed.
	Token [16]byte
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
	// Resumed is how many bytes from the start of the file the target
	// already has, verified and written, from a lost session's push of
	// the same Token: a whole number of chunks (or the whole file). The
	// initiator's first PushWindow starts there. 0 for a new push.
	Resumed uint64
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

func (m *Push) Type() Type { return TypePush }

func (m *Push) ID() uint32 { return m.RequestID }

func (m *Push) SetID(id uint32) { m.RequestID = id }

func (m *PushReply) Type() Type { return TypePushReply }

func (m *PushReply) ID() uint32 { return m.RequestID }

func (m *PushReply) SetID(id uint32) { m.RequestID = id }

func (m *PushWindow) Type() Type { return TypePushWindow }

func (m *PushWindow) ID() uint32 { return m.RequestID }

func (m *PushWindow) SetID(id uint32) { m.RequestID = id }

func (m *PushWindowReply) Type() Type { return TypePushWindowReply }

func (m *PushWindowReply) ID() uint32 { return m.RequestID }

func (m *PushWindowReply) SetID(id uint32) { m.RequestID = id }

func (m *PushCommit) Type() Type { return TypePushCommit }

func (m *PushCommit) ID() uint32 { return m.RequestID }

func (m *PushCommit) SetID(id uint32) { m.RequestID = id }

func (m *Push) encode(e *encoder) {
	e.u8(m.Algorithm)
	e.u32(m.ChunkSize)
	e.u8(m.Retries)
	e.u64(m.Size)
	e.u32(m.Mode)
	e.i64(m.MtimeNs)
	e.str(m.Path)
	e.str(m.Name)
	e.raw(m.Token[:])
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
	d.array(m.Token[:])
}

func (m *PushReply) encode(e *encoder) {
	e.u32(m.Handle)
	e.u32(m.ChunkSize)
	e.u8(m.Algorithm)
	e.u32(m.Chunks)
	e.str(m.Path)
	e.u64(m.Resumed)
}

func (m *PushReply) decode(d *decoder) {
	m.Handle = d.u32()
	m.ChunkSize = d.u32()
	m.Algorithm = d.u8()
	m.Chunks = d.u32()
	m.Path = d.str()
	m.Resumed = d.u64()
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

func (m *PushCommit) decode(d *decoder) {
	m.Handle = d.u32()
	m.FileDigest = d.blob()
}
