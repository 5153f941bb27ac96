package protocol

import "fmt"

// Messages any exchange may carry: Ack, Error, Bye, Working. Each family
// of requests has its own file: auth.go (the handshake), filemsg.go,
// mapmsg.go, treemsg.go and pushmsg.go.

// Ack is the empty reply.
type Ack struct {
	RequestID uint32
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

// Type, ID and SetID for each message.

func (m *Ack) Type() Type          { return TypeAck }
func (m *Ack) ID() uint32          { return m.RequestID }
func (m *Ack) SetID(id uint32)     { m.RequestID = id }
func (m *Error) Type() Type        { return TypeError }
func (m *Error) ID() uint32        { return m.RequestID }
func (m *Error) SetID(id uint32)   { m.RequestID = id }
func (m *Bye) Type() Type          { return TypeBye }
func (m *Bye) ID() uint32          { return m.RequestID }
func (m *Bye) SetID(id uint32)     { m.RequestID = id }
func (m *Working) Type() Type      { return TypeWorking }
func (m *Working) ID() uint32      { return m.RequestID }
func (m *Working) SetID(id uint32) { m.RequestID = id }

// Bodies. Each encode writes the fields in wire order; each decode reads
// them back in the same order.

func (m *Ack) encode(e *encoder) {}
func (m *Ack) decode(d *decoder) {}

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
