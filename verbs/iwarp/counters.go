package iwarp

// Counters for whoever wants them (the target's metrics), asserted as
// optional interfaces so that verbs stays free of them: a provider
// without them is simply not counted.

// ReadResponseBytes is the payload of the Read Responses this QP has
// sent: the bytes the peer READ from this side's memory. One atomic add
// per READ served, in the writer that sends it.
func (q *qp) ReadResponseBytes() uint64 { return q.respBytes.Load() }

// SpanSumBytes is the part of ReadResponseBytes whose MPA CRC came from
// the region's SpanSums instead of reading the bytes.
func (q *qp) SpanSumBytes() uint64 { return q.spanBytes.Load() }

// TerminateCode names the Terminate (layer, error type and code, as the
// RFC 5040/5041/5044 tables do), for an error that wraps one: the Err of
// a QP whose connection was terminated.
func (e *termError) TerminateCode() string { return termName(e.layer, e.etype, e.code) }
