package protocol

// Meta is what an Entry says beyond its type, mode, size and mtime: the
// owner, the identity of the inode (for hard links) and, if asked for,
// extended attributes. It travels only to an initiator that announced
// FeatureMeta, in messages whose header has FlagMeta set; then every
// Entry of the message carries one (a nil Meta encodes as a zero one).
type Meta struct {
	Flags uint8  // MetaXattrsOmitted
	UID   uint32 // st_uid
	GID   uint32 // st_gid
	// User and Group name UID and GID on the target, empty where the
	// target has no name for them: the initiator maps names, not
	// numbers, unless told --numeric-ids.
	User  string
	Group string
	// Dev, Ino and Nlink are st_dev, st_ino and st_nlink: entries of one
	// walk with the same Dev and Ino are hard links of one file.
	Dev    uint64
	Ino    uint64
	Nlink  uint32
	Xattrs []Xattr // only to an initiator that announced FeatureXattrs
}

// Xattr is one extended attribute: its full name ("user.mime_type",
// "system.posix_acl_access") and value.
type Xattr struct {
	Name  string
	Value []byte
}

// Meta flags.
const (
	// MetaXattrsOmitted: the file has extended attributes that are not
	// in Xattrs, because they could not be read or would pass
	// MaxXattrBytes.
	MetaXattrsOmitted uint8 = 1 << 0
	metaFlagsKnown          = MetaXattrsOmitted
)

// MaxXattrBytes bounds an entry's Xattrs: the sum of their names' and
// values' lengths. A file with more sends none, with MetaXattrsOmitted,
// so that any entry fits one message.
const MaxXattrBytes = 32 << 10

// FlagMeta is the header flag saying that every Entry of the message is
// followed by its Meta.
const FlagMeta uint16 = 1 << 0

// metaMin is the encoded size of a zero Meta.
const metaMin = 1 + 4 + 4 + 2 + 2 + 8 + 8 + 4 + 2

// xattrMin is the encoded size of an Xattr with an empty name and value.
const xattrMin = 2 + 4

// MetaSize is the number of bytes m adds to its Entry's encoding: 0 for
// nil, which the target uses for a session without FeatureMeta.
func MetaSize(m *Meta) int {
	if m == nil {
		return 0
	}
	n := metaMin + len(m.User) + len(m.Group)
	for _, x := range m.Xattrs {
		n += xattrMin + len(x.Name) + len(x.Value)
	}
	return n
}

// XattrBytes is what xs counts against MaxXattrBytes.
func XattrBytes(xs []Xattr) int {
	n := 0
	for _, x := range xs {
		n += len(x.Name) + len(x.Value)
	}
	return n
}

func encodeMeta(e *encoder, m *Meta) {
	if m == nil {
		m = &Meta{}
	}
	e.u8(m.Flags)
	e.u32(m.UID)
	e.u32(m.GID)
	e.str(m.User)
	e.str(m.Group)
	e.u64(m.Dev)
	e.u64(m.Ino)
	e.u32(m.Nlink)
	if len(m.Xattrs) > 1<<16-1 {
		if e.err == nil {
			e.err = ErrTooLarge
		}
		return
	}
	e.u16(uint16(len(m.Xattrs)))
	for _, x := range m.Xattrs {
		e.str(x.Name)
		e.blob(x.Value)
	}
}

func decodeMeta(d *decoder) *Meta {
	m := &Meta{}
	off := d.off
	m.Flags = d.u8()
	if m.Flags&^metaFlagsKnown != 0 {
		d.fail("meta flags %#02x at byte %d: unknown bits", m.Flags, off)
	}
	m.UID = d.u32()
	m.GID = d.u32()
	m.User = d.str()
	m.Group = d.str()
	m.Dev = d.u64()
	m.Ino = d.u64()
	m.Nlink = d.u32()
	n := int(d.u16())
	if d.err != nil {
		return nil
	}
	if n*xattrMin > len(d.b)-d.off {
		d.fail("%d xattrs at byte %d need at least %d bytes, have %d", n, d.off-2, n*xattrMin, len(d.b)-d.off)
		return nil
	}
	if n > 0 {
		m.Xattrs = make([]Xattr, n)
		for i := range m.Xattrs {
			m.Xattrs[i].Name = d.str()
			m.Xattrs[i].Value = d.blob()
		}
		if XattrBytes(m.Xattrs) > MaxXattrBytes {
			d.fail("xattrs of %d bytes, over %d", XattrBytes(m.Xattrs), MaxXattrBytes)
		}
	}
	return m
}

// hasMeta reports whether any Entry of m has a Meta, so that m goes with
// FlagMeta.
func hasMeta(m Message) bool {
	switch m := m.(type) {
	case *StatReply:
		return m.Entry.Meta != nil
	case *OpenReply:
		return m.Entry.Meta != nil
	case *ListReply:
		for i := range m.Entries {
			if m.Entries[i].Meta != nil {
				return true
			}
		}
	case *PackReply:
		for i := range m.Files {
			if m.Files[i].Entry.Meta != nil {
				return true
			}
		}
	case *WalkBatch:
		for i := range m.Entries {
			if m.Entries[i].Entry.Meta != nil {
				return true
			}
		}
	}
	return false
}

// carriesEntries reports whether messages of type t have Entries, the
// only ones FlagMeta may be set on.
func carriesEntries(t Type) bool {
	switch t {
	case TypeStatReply, TypeOpenReply, TypeListReply, TypePackReply, TypeWalkBatch:
		return true
	}
	return false
}
