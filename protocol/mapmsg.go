package protocol

// Messages that map a file range for READs, and unmap it.

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

func (m *Map) Type() Type { return TypeMap }

func (m *Map) ID() uint32 { return m.RequestID }

func (m *Map) SetID(id uint32) { m.RequestID = id }

func (m *MapReply) Type() Type { return TypeMapReply }

func (m *MapReply) ID() uint32 { return m.RequestID }

func (m *MapReply) SetID(id uint32) { m.RequestID = id }

func (m *Unmap) Type() Type { return TypeUnmap }

func (m *Unmap) ID() uint32 { return m.RequestID }

func (m *Unmap) SetID(id uint32) { m.RequestID = id }

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
