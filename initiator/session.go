// Package initiator is rdmacp's initiator: it opens a session to a
// target, joins data QPs to it, and pulls files with pipelined RDMA READs
// striped over those QPs, verifying every chunk against the target's
// digest. It owns the policy the verbs layer leaves open: how many QPs,
// how many READs in flight, retries and verification.
package initiator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// Config configures a session. Zero fields take the defaults noted.
type Config struct {
	Device verbs.Device // required
	Secret []byte
	QPs    int // data QPs; default 4
	// Depth is the READs in flight per data QP; default 4, capped by
	// what the connection negotiated.
	Depth int
	// ReadSize is the bytes one READ moves; default 1 MiB, capped by the
	// chunk size and the device's message limit.
	ReadSize  int
	ChunkSize int64             // 0: the target's default
	Algorithm chunker.Algorithm // default CRC32C
	Retries   int               // re-reads of a chunk that fails its digest; default 3
	Logger    *slog.Logger
}

func (c *Config) setDefaults() {
	if c.QPs == 0 {
		c.QPs = 4
	}
	if c.Depth == 0 {
		c.Depth = 4
	}
	if c.ReadSize == 0 {
		c.ReadSize = 1 << 20
	}
	if c.Retries == 0 {
		c.Retries = 3
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	switch {
	case c.Device == nil:
		return errors.New("initiator: no device")
	case c.QPs < 1 || c.QPs > 64:
		return fmt.Errorf("initiator: --qps %d: want 1..64", c.QPs)
	case c.Depth < 1 || c.Depth > 1024:
		return fmt.Errorf("initiator: --depth %d: want 1..1024", c.Depth)
	case c.ReadSize < 4096:
		return fmt.Errorf("initiator: read size %d: want at least 4096", c.ReadSize)
	case c.Retries < 0:
		return fmt.Errorf("initiator: retries %d", c.Retries)
	case !c.Algorithm.Valid():
		return fmt.Errorf("initiator: unknown checksum algorithm %d", c.Algorithm)
	}
	if c.ChunkSize != 0 {
		if err := chunker.ValidateChunkSize(c.ChunkSize); err != nil {
			return fmt.Errorf("initiator: %w", err)
		}
	}
	return nil
}

// Error kinds that callers map to exit codes.
var (
	// ErrConnect: the target could not be reached or the connection broke.
	ErrConnect = errors.New("connection to target failed")
	// ErrAuth: the secret was missing or wrong, on either side.
	ErrAuth = errors.New("authentication failed")
	// ErrVerify: a chunk failed its digest after every retry.
	ErrVerify = errors.New("verification failed")
	// ErrChanged: the source changed while it was copied.
	ErrChanged = errors.New("source changed during the copy")
)

// Session is an open session to a target.
type Session struct {
	cfg    Config
	addr   string
	pd     verbs.PD
	ch     *protocol.Channel
	ch0    *protocol.Challenge
	data   []verbs.QP
	dataCQ verbs.CQ
	rcq    verbs.CQ
	reads  int // READs in flight per data QP

	bytesRead atomic.Int64
	lister    lister // tests: a fake target's listings for GetTree
	noPack    bool   // the target does not know Pack
	noWalk    bool   // the target does not know Walk
	packs     int    // Packs answered, and walk batches with packed files
	closeOnce sync.Once
	// broken is why the data QPs can no longer be trusted: READs of an
	// earlier transfer that never completed (see drain).
	broken  error
	packBuf *verbs.Buffer
	packMR  verbs.MR // over packBuf
}

// BytesRead is how many bytes the session has pulled with RDMA READs.
func (s *Session) BytesRead() int64 { return s.bytesRead.Load() }

// Dial opens a session to the target at addr and joins its data QPs.
func Dial(ctx context.Context, addr string, cfg Config) (*Session, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Session{cfg: cfg, addr: addr}
	if err := s.dial(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func connectErr(err error) error {
	var rej *verbs.RejectedError
	if errors.As(err, &rej) && len(rej.PrivateData) > 0 {
		return fmt.Errorf("%w: target refused: %s", ErrConnect, rej.PrivateData)
	}
	return fmt.Errorf("%w: %w", ErrConnect, err)
}

func (s *Session) dial(ctx context.Context) error {
	dev := s.cfg.Device
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	if s.ch, err = protocol.NewChannel(dev, s.pd, 0); err != nil {
		return err
	}
	pq, err := dev.PrepareDial(ctx, s.pd, s.addr, s.ch.QPConfig())
	if err != nil {
		return connectErr(err)
	}
	if err := s.ch.PostRecvs(pq); err != nil {
		pq.Close()
		return err
	}
	priv, _ := protocol.MarshalPrivate(protocol.ControlData())
	qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
	if err != nil {
		return connectErr(err)
	}
	s.ch.Attach(qp)
	if err := s.hello(ctx); err != nil {
		return err
	}
	return s.join(ctx)
}

func (s *Session) call(ctx context.Context, m protocol.Message) (protocol.Message, error) {
	r, err := s.ch.Call(ctx, m)
	if errors.Is(err, protocol.ErrClosed) {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	return r, err
}

func (s *Session) hello(ctx context.Context) error {
	h := &protocol.Hello{MinVersion: protocol.Version, MaxVersion: protocol.Version, ClientNonce: protocol.NewNonce(), Client: "rdmacp"}
	m, err := s.call(ctx, h)
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeVersion {
			return fmt.Errorf("%w: %w", ErrConnect, err)
		}
		return err
	}
	ch, ok := m.(*protocol.Challenge)
	if !ok {
		return fmt.Errorf("%w: target answered Hello with %v", ErrConnect, m.Type())
	}
	s.ch0 = ch
	if !ch.AuthRequired {
		if len(s.cfg.Secret) > 0 {
			// A target that knows no secret can't prove it is the one we meant.
			return fmt.Errorf("%w: we hold a secret but the target asks for none, so it cannot prove who it is", ErrAuth)
		}
		return nil
	}
	if len(s.cfg.Secret) == 0 {
		return fmt.Errorf("%w: the target requires a secret (--secret-file or RDMACP_SECRET)", ErrAuth)
	}
	m, err = s.call(ctx, &protocol.Auth{MAC: protocol.ClientMAC(s.cfg.Secret, ch.ServerNonce, h.ClientNonce)})
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) && pe.Code == protocol.CodeAuthFailed {
			return fmt.Errorf("%w: the target refused our secret", ErrAuth)
		}
		return err
	}
	ok2, isOK := m.(*protocol.AuthOK)
	if !isOK || !protocol.CheckMAC(ok2.MAC, protocol.ServerMAC(s.cfg.Secret, ch.ServerNonce, h.ClientNonce)) {
		return fmt.Errorf("%w: the target does not know the secret", ErrAuth)
	}
	return nil
}

// join connects the data QPs, each naming the session in its private data.
func (s *Session) join(ctx context.Context) error {
	dev := s.cfg.Device
	n := min(s.cfg.QPs, int(s.ch0.MaxDataQPs))
	if n < 1 {
		return fmt.Errorf("%w: target accepts no data QPs", ErrConnect)
	}
	depth := s.cfg.Depth
	if m := int(s.ch0.MaxReadsPerQP); m > 0 {
		depth = min(depth, m)
	}
	var err error
	if s.dataCQ, err = dev.CreateCQ(n*depth + 16); err != nil {
		return err
	}
	if s.rcq, err = dev.CreateCQ(1); err != nil {
		return err
	}
	s.reads = depth
	for i := range n {
		pq, err := dev.PrepareDial(ctx, s.pd, s.addr, verbs.QPConfig{SendCQ: s.dataCQ, RecvCQ: s.rcq, MaxSendWR: depth + 4, MaxRecvWR: 1, MaxReadsOut: depth})
		if err != nil {
			return connectErr(err)
		}
		priv, _ := protocol.MarshalPrivate(protocol.JoinData(s.ch0.Session, uint16(i)))
		qp, err := pq.Connect(ctx, verbs.ConnParam{PrivateData: priv})
		if err != nil {
			return connectErr(err)
		}
		s.data = append(s.data, qp)
		s.reads = min(s.reads, qp.Info().ReadsOut)
	}
	s.cfg.Logger.Debug("session open", "target", s.addr, "data_qps", len(s.data), "reads_per_qp", s.reads, "conn", s.data[0].Info().Detail)
	return nil
}

// Transport describes the connection, e.g. "iwarp-soft (mpa rev 2, crc32c on)".
func (s *Session) Transport() string {
	d := s.cfg.Device.Provider()
	if len(s.data) > 0 {
		d += " (" + s.data[0].Info().Detail + ")"
	}
	return d
}

// DataQPs and ReadsPerQP report what the session negotiated.
func (s *Session) DataQPs() int    { return len(s.data) }
func (s *Session) ReadsPerQP() int { return s.reads }

// Stat returns the entry of a path ("EXPORT/dir/file").
func (s *Session) Stat(ctx context.Context, path string) (protocol.Entry, error) {
	m, err := s.call(ctx, &protocol.Stat{Path: path})
	if err != nil {
		return protocol.Entry{}, err
	}
	r, ok := m.(*protocol.StatReply)
	if !ok {
		return protocol.Entry{}, unexpected(m)
	}
	return r.Entry, nil
}

// List returns a directory's entries; path "" lists the exports.
func (s *Session) List(ctx context.Context, path string) ([]protocol.Entry, error) {
	var all []protocol.Entry
	var cookie uint64
	for {
		m, err := s.call(ctx, &protocol.List{Path: path, Cookie: cookie})
		if err != nil {
			return nil, err
		}
		r, ok := m.(*protocol.ListReply)
		if !ok {
			return nil, unexpected(m)
		}
		all = append(all, r.Entries...)
		if r.NextCookie == 0 {
			return all, nil
		}
		if r.NextCookie <= cookie {
			return nil, fmt.Errorf("%w: list cookie went from %d to %d", protocol.ErrMalformed, cookie, r.NextCookie)
		}
		cookie = r.NextCookie
	}
}

// retryBusy calls m, again while the target answers TooMany (its window
// budget in use by other sessions, or this session's limits), for up to a
// minute, with a backoff. again, if set, is called before each new try.
func (s *Session) retryBusy(ctx context.Context, again func(), m protocol.Message) (protocol.Message, error) {
	backoff := 10 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		r, err := s.call(ctx, m)
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany || time.Now().After(deadline) {
			return r, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, time.Second)
		if again != nil {
			again()
		}
	}
}

func unexpected(m protocol.Message) error {
	return fmt.Errorf("%w: unexpected %v reply", protocol.ErrMalformed, m.Type())
}

// drainTimeout bounds how long drain waits for stray READs.
const drainTimeout = 10 * time.Second

// drain waits for n READs still in flight when a transfer ends early, so
// that their completions are not taken for the next transfer's. If they
// do not come (or the CQ fails), the session is marked broken.
func (s *Session) drain(n int) {
	if n <= 0 || s.broken != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	comps := make([]verbs.Completion, 64)
	for n > 0 {
		k, err := s.dataCQ.Poll(comps[:min(n, len(comps))])
		if err == nil && k == 0 {
			err = s.dataCQ.Wait(ctx)
		}
		if err != nil {
			s.broken = fmt.Errorf("%w: %d READs of an earlier transfer never completed: %w", ErrConnect, n, err)
			return
		}
		n -= k
	}
}

// usable says why the data QPs can't be used, if they can't.
func (s *Session) usable() error { return s.broken }

// Close ends the session. Calls after the first do nothing.
func (s *Session) Close() error {
	s.closeOnce.Do(s.close)
	return nil
}

func (s *Session) close() {
	if s.ch != nil && s.ch.QP() != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 1e9)
		s.ch.Send(ctx, &protocol.Bye{})
		cancel()
	}
	for _, qp := range s.data {
		qp.Close()
	}
	s.freePackSink()
	if s.ch != nil {
		s.ch.Close()
	}
	if s.dataCQ != nil {
		s.dataCQ.Close()
	}
	if s.rcq != nil {
		s.rcq.Close()
	}
	if s.pd != nil {
		s.pd.Close()
	}
}
