// Package protocol is rdmacp's control protocol, which the initiator and
// the target share: they meet only on the wire.
//
// The initiator's first queue pair to a target is the control QP. Control
// messages travel on it as RDMA SEND/RECV, one message per SEND, at most
// MaxMessage bytes each. File data never does: the initiator pulls it with
// RDMA READs from windows the target maps for it.
//
// Every message is an 8-byte header followed by a body whose layout the
// message's type fixes. All integers are big-endian. docs/protocol.md (section 2)
// describes the wire format field by field.
package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the protocol version this package speaks.
const Version = 1

// MaxMessage is the largest control message, header included. Receivers
// post buffers of this size.
const MaxMessage = 64 << 10

// MaxOutstanding is how many requests an initiator may have sent and not
// yet had answered. Each side keeps MaxOutstanding+1 receives of
// MaxMessage bytes posted on the control QP (the extra one for Bye), and a
// target reposts a request's receive before sending its reply, so a SEND
// never finds the receiver without a buffer.
const MaxOutstanding = 16

// HeaderSize is the size of the message header.
const HeaderSize = 8

// MaxString is the longest string a message can carry, in bytes.
const MaxString = 1<<16 - 1

var (
	// ErrMalformed is wrapped by every decoding error except a version
	// mismatch.
	ErrMalformed = errors.New("protocol: malformed message")
	// ErrVersion is wrapped by *VersionError.
	ErrVersion = errors.New("protocol: unsupported version")
	// ErrTooLarge is wrapped by encoding errors for values that do not fit
	// their field or a message that does not fit MaxMessage.
	ErrTooLarge = errors.New("protocol: too large")
)

// VersionError reports a header, or private data, with a version other
// than Version, or a peer that speaks another version.
type VersionError struct {
	Got  uint8
	Peer string // "target" or "initiator" when the peer said its version; empty for a header
}

func (e *VersionError) Error() string {
	if e.Peer == "" {
		return fmt.Sprintf("protocol: unsupported version %d (this side speaks %d)", e.Got, Version)
	}
	return VersionMismatch(e.Peer, fmt.Sprint(e.Got))
}

// VersionMismatch is the one sentence either side gives a peer of another
// protocol version: it names both versions and what to do about it.
// peer is "target" or "initiator"; theirs is its version or range.
func VersionMismatch(peer, theirs string) string {
	self := "target"
	if peer == "target" {
		self = "initiator"
	}
	return fmt.Sprintf("%s speaks rdmacp protocol %s, this %s speaks %d: use the same rdmacp release on both ends", peer, theirs, self, Version)
}

func (e *VersionError) Unwrap() error { return ErrVersion }

// Type is a message type.
type Type uint8

// Message types. The target answers each request from the initiator with
// the request's reply type or with Error.
const (
	TypeHello           Type = 1
	TypeChallenge       Type = 2
	TypeAuth            Type = 3
	TypeAuthOK          Type = 4
	TypeList            Type = 5
	TypeListReply       Type = 6
	TypeStat            Type = 7
	TypeStatReply       Type = 8
	TypeOpen            Type = 9
	TypeOpenReply       Type = 10
	TypeDigests         Type = 11
	TypeDigestsReply    Type = 12
	TypeMap             Type = 13
	TypeMapReply        Type = 14
	TypeUnmap           Type = 15
	TypeAck             Type = 16
	TypeClose           Type = 17
	TypeCloseReply      Type = 18
	TypeError           Type = 19
	TypeBye             Type = 20
	TypePack            Type = 21
	TypePackReply       Type = 22
	TypePush            Type = 23
	TypePushReply       Type = 24
	TypePushWindow      Type = 25
	TypePushWindowReply Type = 26
	TypePushCommit      Type = 27
	TypeWalk            Type = 28
	TypeWalkNext        Type = 29
	TypeWalkBatch       Type = 30
	TypeWorking         Type = 31
	TypeAuthAs          Type = 32 // Auth naming an identity: see identity.go
	TypeExtents         Type = 33 // FeatureWinDigests: where an open file's data is
	TypeExtentsReply    Type = 34
	TypeClosed          Type = 35 // FeatureWinDigests: CloseReply with the file digest
	TypeSuspect         Type = 36 // FeatureWinDigests: a chunk that keeps failing

	// typeMax is the highest type this package knows.
	typeMax = TypeRailDrop
)

var typeNames = [...]string{
	TypeHello:           "Hello",
	TypeChallenge:       "Challenge",
	TypeAuth:            "Auth",
	TypeAuthOK:          "AuthOK",
	TypeList:            "List",
	TypeListReply:       "ListReply",
	TypeStat:            "Stat",
	TypeStatReply:       "StatReply",
	TypeOpen:            "Open",
	TypeOpenReply:       "OpenReply",
	TypeDigests:         "Digests",
	TypeDigestsReply:    "DigestsReply",
	TypeMap:             "Map",
	TypeMapReply:        "MapReply",
	TypeUnmap:           "Unmap",
	TypeAck:             "Ack",
	TypeClose:           "Close",
	TypeCloseReply:      "CloseReply",
	TypeError:           "Error",
	TypeBye:             "Bye",
	TypePack:            "Pack",
	TypePackReply:       "PackReply",
	TypePush:            "Push",
	TypePushReply:       "PushReply",
	TypePushWindow:      "PushWindow",
	TypePushWindowReply: "PushWindowReply",
	TypePushCommit:      "PushCommit",
	TypeWalk:            "Walk",
	TypeWalkNext:        "WalkNext",
	TypeWalkBatch:       "WalkBatch",
	TypeWorking:         "Working",
	TypeAuthAs:          "AuthAs",
	TypeRails:           "Rails",
	TypeRailsReply:      "RailsReply",
	TypeRailDrop:        "RailDrop",
	TypeExtents:         "Extents",
	TypeExtentsReply:    "ExtentsReply",
	TypeClosed:          "Closed",
	TypeSuspect:         "Suspect",
}

func (t Type) String() string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// newMessage returns an empty message of type t, or nil if t is unknown.
func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return new(Hello)
	case TypeChallenge:
		return new(Challenge)
	case TypeAuth:
		return new(Auth)
	case TypeAuthOK:
		return new(AuthOK)
	case TypeList:
		return new(List)
	case TypeListReply:
		return new(ListReply)
	case TypeStat:
		return new(Stat)
	case TypeStatReply:
		return new(StatReply)
	case TypeOpen:
		return new(Open)
	case TypeOpenReply:
		return new(OpenReply)
	case TypeDigests:
		return new(Digests)
	case TypeDigestsReply:
		return new(DigestsReply)
	case TypeMap:
		return new(Map)
	case TypeMapReply:
		return new(MapReply)
	case TypeUnmap:
		return new(Unmap)
	case TypeAck:
		return new(Ack)
	case TypeClose:
		return new(Close)
	case TypeCloseReply:
		return new(CloseReply)
	case TypeError:
		return new(Error)
	case TypeBye:
		return new(Bye)
	case TypePack:
		return new(Pack)
	case TypePackReply:
		return new(PackReply)
	case TypePush:
		return new(Push)
	case TypePushReply:
		return new(PushReply)
	case TypePushWindow:
		return new(PushWindow)
	case TypePushWindowReply:
		return new(PushWindowReply)
	case TypePushCommit:
		return new(PushCommit)
	case TypeWalk:
		return new(Walk)
	case TypeWalkNext:
		return new(WalkNext)
	case TypeWalkBatch:
		return new(WalkBatch)
	case TypeWorking:
		return new(Working)
	case TypeAuthAs:
		return new(AuthAs)
	case TypeRails:
		return new(Rails)
	case TypeRailsReply:
		return new(RailsReply)
	case TypeRailDrop:
		return new(RailDrop)
	case TypeExtents:
		return new(Extents)
	case TypeExtentsReply:
		return new(ExtentsReply)
	case TypeClosed:
		return new(Closed)
	case TypeSuspect:
		return new(Suspect)
	}
	return nil
}

// Message is one control message: a pointer to one of this package's
// message structs. Each carries the RequestID of its header; a reply
// carries the RequestID of the request it answers.
type Message interface {
	Type() Type
	ID() uint32
	SetID(id uint32)
	encode(e *encoder)
	decode(d *decoder)
}

// Header is the first HeaderSize bytes of every message.
type Header struct {
	Version   uint8
	Type      Type
	Flags     uint16 // FlagMeta, on messages that carry entries; no others are defined
	RequestID uint32
}

// ParseHeader decodes and checks the header of message b without decoding
// its body, so that a receiver can answer a message it cannot decode with
// an Error carrying the right RequestID. It does not check the type.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes is shorter than a header", ErrMalformed, len(b))
	}
	h := Header{
		Version:   b[0],
		Type:      Type(b[1]),
		Flags:     binary.BigEndian.Uint16(b[2:]),
		RequestID: binary.BigEndian.Uint32(b[4:]),
	}
	if h.Version != Version {
		return h, &VersionError{Got: h.Version}
	}
	if len(b) > MaxMessage {
		return h, fmt.Errorf("%w: %d bytes is over MaxMessage", ErrMalformed, len(b))
	}
	if h.Flags&^FlagMeta != 0 {
		return h, fmt.Errorf("%w: unknown flags %#04x", ErrMalformed, h.Flags)
	}
	return h, nil
}

// DecodeError is a message whose header decoded but whose type is
// unknown or whose body is malformed: Header lets the receiver answer it
// (BadRequest, or Unsupported for an unknown type) under its RequestID.
// It wraps ErrMalformed.
type DecodeError struct {
	Header Header
	err    error
}

func (e *DecodeError) Error() string { return e.err.Error() }
func (e *DecodeError) Unwrap() error { return e.err }

// Known reports whether this package knows message type t.
func (t Type) Known() bool { return newMessage(t) != nil }

// Unmarshal decodes one message. It never panics, and allocates no more
// than the length of b justifies. Errors wrap ErrMalformed (as a
// *DecodeError once the header is good), or ErrVersion for a header of
// another version.
func Unmarshal(b []byte) (Message, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	m := newMessage(h.Type)
	if m == nil {
		return nil, &DecodeError{Header: h, err: fmt.Errorf("%w: unknown message type %d", ErrMalformed, uint8(h.Type))}
	}
	d := decoder{b: b, off: HeaderSize, meta: h.Flags&FlagMeta != 0}
	if d.meta && !carriesEntries(h.Type) {
		return nil, &DecodeError{Header: h, err: fmt.Errorf("%w: %s with FlagMeta, which only messages with entries take", ErrMalformed, h.Type)}
	}
	m.decode(&d)
	if d.err == nil && d.meta && !hasMeta(m) {
		d.err = fmt.Errorf("FlagMeta but no entries") // Marshal would not set it: one encoding per message
	}
	if d.err == nil && d.off != len(b) {
		d.err = fmt.Errorf("%d trailing bytes", len(b)-d.off)
	}
	if d.err != nil {
		return nil, &DecodeError{Header: h, err: fmt.Errorf("%w: %s: %w", ErrMalformed, h.Type, d.err)}
	}
	m.SetID(h.RequestID)
	return m, nil
}

// Marshal encodes m.
func Marshal(m Message) ([]byte, error) {
	return AppendMarshal(nil, m)
}

// AppendMarshal appends the encoding of m to dst. On error it returns dst
// unchanged. A message over MaxMessage is an error wrapping ErrTooLarge, as
// is a string over MaxString bytes.
func AppendMarshal(dst []byte, m Message) ([]byte, error) {
	if m == nil {
		return dst, errors.New("protocol: marshal of nil message")
	}
	start := len(dst)
	e := encoder{b: dst, meta: hasMeta(m)}
	var flags uint16
	if e.meta {
		flags = FlagMeta
	}
	e.u8(Version)
	e.u8(uint8(m.Type()))
	e.u16(flags)
	e.u32(m.ID())
	m.encode(&e)
	if e.err != nil {
		return dst[:start], fmt.Errorf("protocol: %s: %w", m.Type(), e.err)
	}
	if n := len(e.b) - start; n > MaxMessage {
		return dst[:start], fmt.Errorf("protocol: %s is %d bytes, over MaxMessage (%d): %w", m.Type(), n, MaxMessage, ErrTooLarge)
	}
	return e.b, nil
}

// encoder appends fields to b, remembering the first error.
type encoder struct {
	b    []byte
	err  error
	meta bool // FlagMeta: each Entry is followed by its Meta
}

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) i64(v int64)  { e.u64(uint64(v)) }
func (e *encoder) raw(p []byte) { e.b = append(e.b, p...) }

func (e *encoder) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

func (e *encoder) str(s string) {
	if len(s) > MaxString {
		if e.err == nil {
			e.err = fmt.Errorf("string of %d bytes is over %d: %w", len(s), MaxString, ErrTooLarge)
		}
		return
	}
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}

func (e *encoder) blob(p []byte) {
	if len(p) > MaxMessage {
		if e.err == nil {
			e.err = fmt.Errorf("blob of %d bytes is over MaxMessage: %w", len(p), ErrTooLarge)
		}
		return
	}
	e.u32(uint32(len(p)))
	e.raw(p)
}

// count writes a list length. Lists longer than MaxMessage cannot fit, and
// stopping here keeps the length within uint32.
func (e *encoder) count(n int) {
	if n > MaxMessage {
		if e.err == nil {
			e.err = fmt.Errorf("list of %d items cannot fit MaxMessage: %w", n, ErrTooLarge)
		}
		return
	}
	e.u32(uint32(n))
}

// decoder reads fields from b starting at off, remembering the first
// error; after an error every read returns a zero value.
type decoder struct {
	b    []byte
	off  int
	err  error
	meta bool // FlagMeta: each Entry is followed by its Meta
}

// failCap records e, a value over a cap, as the decoding error.
func (d *decoder) failCap(e *CapError) {
	if d.err == nil {
		d.err = e
	}
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

// take returns the next n bytes, aliasing b.
func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("truncated at byte %d: need %d bytes, have %d", d.off, n, len(d.b)-d.off)
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) i64() int64 { return int64(d.u64()) }

func (d *decoder) bool() bool {
	off := d.off
	switch v := d.u8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("bool at byte %d is %d, not 0 or 1", off, v)
		return false
	}
}

// array fills dst, a fixed-size field.
func (d *decoder) array(dst []byte) { copy(dst, d.take(len(dst))) }

func (d *decoder) str() string {
	n := d.u16()
	return string(d.take(int(n)))
}

// blob returns a copy of a length-prefixed byte string, nil if empty. The
// copy matters: receive buffers are reused.
func (d *decoder) blob() []byte {
	n := d.u32()
	if d.err != nil || n == 0 {
		return nil
	}
	if uint64(n) > uint64(len(d.b)-d.off) {
		d.fail("blob of %d bytes at byte %d runs past the end", n, d.off-4)
		return nil
	}
	return append([]byte(nil), d.take(int(n))...)
}

// count reads a list length and checks that the bytes left could hold that
// many items of at least min bytes each, before anyone allocates for them.
func (d *decoder) count(min int) int {
	n := d.u32()
	if d.err != nil {
		return 0
	}
	if uint64(n)*uint64(min) > uint64(len(d.b)-d.off) {
		d.fail("list of %d items at byte %d needs at least %d bytes, have %d", n, d.off-4, uint64(n)*uint64(min), len(d.b)-d.off)
		return 0
	}
	return int(n)
}
