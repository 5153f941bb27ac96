package verbs

import (
	"errors"
	"fmt"
)

// OpError is the error type of every verbs call, shaped like net.OpError:
// which operation of which provider failed, and the wrapped cause (an
// errno, a Status or a sentinel below).
type OpError struct {
	Op       string // "reg_mr", "connect", "post_send", ...
	Provider string
	Addr     string // peer address, when there is one
	Err      error
}

func (e *OpError) Error() string {
	s := e.Provider + " " + e.Op
	if e.Addr != "" {
		s += " " + e.Addr
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *OpError) Unwrap() error { return e.Err }

// Sentinels that OpError wraps.
var (
	ErrClosed       = errors.New("use of closed object")
	ErrQueueFull    = errors.New("work queue full")
	ErrInvalid      = errors.New("invalid argument")
	ErrUnsupported  = errors.New("not supported by this provider")
	ErrNoDevice     = errors.New("no such device")
	ErrCQOverrun    = errors.New("completion queue overrun")
	ErrDisconnected = errors.New("disconnected")
)

// RejectedError reports a connection the peer refused, with the private
// data it sent back (rdma_cm's REJECTED event).
type RejectedError struct {
	PrivateData []byte
}

func (e *RejectedError) Error() string {
	return fmt.Sprintf("connection rejected by peer (%d bytes of private data)", len(e.PrivateData))
}
