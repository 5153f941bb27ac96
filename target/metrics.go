package target

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/verbs"
)

// Metrics. The target is out of the data path, so it counts at the
// granularity it sees: a window mapped, a file opened or closed, a
// session begun or ended, never a READ. Gauges of what the server holds
// (sessions, handshakes, the window budget) are read when scraped.
//
// Bytes served come from three places, each its own metric:
//   - rdmacp_served_bytes_total: the bytes of the windows the target
//     mapped for initiators to READ (files, packs, walk batches), by
//     export and identity. An initiator reads all of a window it maps
//     (it maps what it means to read), so this is what was served, give
//     or take a copy that stopped half-way through a window.
//   - rdmacp_read_response_bytes_total: what the pure-Go iWARP provider
//     sent in Read Responses, counted by its QPs (ReadResponseBytes) and
//     gathered per session when a window is unmapped and when the
//     session ends, by identity.
//     rdmacp_read_response_span_crc_bytes_total is the part of them whose
//     MPA CRC came from the span sums the hash pass kept (spans.go),
//     counted alike (SpanSumBytes).
//   - rdmacp_port_xmit_bytes_total: an RDMA device's port counter
//     (sysfs port_xmit_data, in 4-byte units), device-wide: all traffic
//     of the port, not only rdmacp's.
type metrics struct {
	reg *prometheus.Registry

	sessions     *prometheus.CounterVec // identity
	refusals     *prometheus.CounterVec // reason: auth, limits, busy
	windows      prometheus.Gauge
	opened       *prometheus.CounterVec // export
	pushed       *prometheus.CounterVec // export
	served       *prometheus.CounterVec // export, identity
	readResp     *prometheus.CounterVec // identity
	spanResp     *prometheus.CounterVec // identity
	replyErrors  *prometheus.CounterVec // code
	readErrors   *prometheus.CounterVec // status
	terminates   *prometheus.CounterVec // code
	hashSeconds  prometheus.Counter
	hashBytes    prometheus.Counter
	pushBytes    *prometheus.CounterVec // export
	pushFailures *prometheus.CounterVec // export
	suspects     *prometheus.CounterVec // result: stale, sound, refused
}

const ns = "rdmacp"

func newMetrics(s *Server) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	m := &metrics{
		reg:      prometheus.NewRegistry(),
		sessions: counter("sessions_total", "Sessions authenticated, by client identity.", "identity"),
		refusals: counter("refusals_total", "Connections and requests refused: auth (failed authentication), limits (handshake and session limits), busy (TooMany answers: window budget, open files, digest memory).", "reason"),
		windows: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "windows_mapped",
			Help: "Windows mapped and registered for initiators' READs (files, packs, walk batches), all sessions."}),
		opened:      counter("files_opened_total", "Files opened for initiators to read (Open, and files packed in Pack and Walk batches), by export.", "export"),
		pushed:      counter("files_pushed_total", "Files pushed into the export and committed, by export.", "export"),
		served:      counter("served_bytes_total", "Bytes of windows mapped for initiators to READ, by export and client identity.", "export", "identity"),
		readResp:    counter("read_response_bytes_total", "Bytes the pure-Go iWARP provider sent in Read Responses, by client identity (counted by the provider's QPs).", "identity"),
		spanResp:    counter("read_response_span_crc_bytes_total", "Of read_response_bytes_total, the bytes whose MPA CRC came from the span sums kept when the file was hashed, not from reading them again.", "identity"),
		replyErrors: counter("request_errors_total", "Requests answered with an error, by protocol error code.", "code"),
		readErrors:  counter("read_errors_total", "RDMA READs of the target's own (pulling pushed files) that failed, by completion status.", "status"),
		terminates:  counter("terminates_total", "Data and control connections that ended with an iWARP Terminate, by its layer, type and code.", "code"),
		hashSeconds: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "digest_seconds_total",
			Help: "Seconds spent hashing files for their chunk digests (cache misses)."}),
		hashBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "digest_bytes_total",
			Help: "Bytes hashed for chunk digests (cache misses)."}),
		pushBytes:    counter("push_bytes_total", "Bytes of pushed files committed, by export.", "export"),
		pushFailures: counter("push_failures_total", "Pushes abandoned (an error, or the session ended before the commit), by export.", "export"),
		suspects:     counter("suspects_total", "Suspect requests (a chunk that failed its digest on every read), by result: stale (hashed again, the stored digests were wrong and dropped), sound (hashed again, the stored digest was right and kept), refused (over the session's Suspect budget).", "result"),
	}
	m.reg.MustRegister(m.sessions, m.refusals, m.windows, m.opened, m.pushed, m.served, m.readResp, m.spanResp,
		m.replyErrors, m.readErrors, m.terminates, m.hashSeconds, m.hashBytes, m.pushBytes, m.pushFailures, m.suspects,
		liveCollector{s}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if d := s.cfg.Device; d != nil && d.Provider() != "iwarp" {
		if pc := newPortCollector(d.Name()); pc != nil {
			m.reg.MustRegister(pc)
		}
	}
	return m
}

// Registry is the server's own metrics registry (not the process-wide
// default), for `rdmacp serve --metrics-listen` to serve and for tests
// to gather.
func (s *Server) Registry() *prometheus.Registry { return s.met.reg }

// refused counts a refusal for reason: "auth", "limits", "evicted" or
// "busy".
func (m *metrics) refused(reason string) { m.refusals.WithLabelValues(reason).Inc() }

// handshakeFailed counts a handshake that failed authentication or found
// the sessions full.
func (m *metrics) handshakeFailed(err error) {
	var full fullError
	switch {
	case errors.Is(err, errAuth):
		m.refused("auth")
	case errors.As(err, &full):
		m.refused("limits")
	}
}

// readError counts a failed READ of the target's own.
func (m *metrics) readError(err error) {
	status := "connection"
	var st verbs.Status
	if errors.As(err, &st) {
		status = st.String()
	}
	m.readErrors.WithLabelValues(status).Inc()
}

// terminated counts a QP that ended with a Terminate (a provider's error
// that names its code: iwarp's).
func (m *metrics) terminated(qp verbs.QP) {
	err := qp.Err()
	var tc interface{ TerminateCode() string }
	if err != nil && errors.As(err, &tc) {
		m.terminates.WithLabelValues(tc.TerminateCode()).Inc()
	}
}

// readResponseBytes sums what qps have sent in Read Responses, and how
// much of it was CRC'd from span sums, where their provider counts it.
func readResponseBytes(qps []verbs.QP) (resp, spans uint64) {
	for _, qp := range qps {
		if c, ok := qp.(interface{ ReadResponseBytes() uint64 }); ok {
			resp += c.ReadResponseBytes()
		}
		if c, ok := qp.(interface{ SpanSumBytes() uint64 }); ok {
			spans += c.SpanSumBytes()
		}
	}
	return resp, spans
}

// noteReadResponses adds to the metric what ss's data QPs sent since the
// last call (at window granularity: an unmap, the session's end).
func (ss *session) noteReadResponses() {
	ss.mu.Lock()
	n, sp := readResponseBytes(ss.data)
	ss.mu.Unlock()
	st := &ss.stats
	st.mu.Lock()
	// A replaced data QP's count goes with it: never count backwards.
	d := n - min(n, st.respSeen)
	ds := sp - min(sp, st.spanSeen)
	st.respSeen, st.spanSeen = n, sp
	st.mu.Unlock()
	if d > 0 {
		ss.srv.met.readResp.WithLabelValues(ss.identity()).Add(float64(d))
	}
	if ds > 0 {
		ss.srv.met.spanResp.WithLabelValues(ss.identity()).Add(float64(ds))
	}
}

// codeLabel is a protocol error code as a label: "not_found".
func codeLabel(c protocol.Code) string {
	return strings.ReplaceAll(strings.ToLower(c.String()), " ", "_")
}

// liveCollector reads, when scraped, what the server holds now.
type liveCollector struct{ s *Server }

var (
	descActive     = prometheus.NewDesc(ns+"_sessions_active", "Sessions authenticated and open now, by client identity.", []string{"identity"}, nil)
	descHandshakes = prometheus.NewDesc(ns+"_handshakes_in_progress", "Control connections accepted and not yet authenticated.", nil, nil)
	descBudgetUsed = prometheus.NewDesc(ns+"_window_budget_used_bytes", "Bytes of the window budget reserved now: windows mapped and push staging, all sessions.", nil, nil)
	descBudget     = prometheus.NewDesc(ns+"_window_budget_bytes", "The window budget (--window-budget).", nil, nil)
)

func (c liveCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descActive
	ch <- descHandshakes
	ch <- descBudgetUsed
	ch <- descBudget
}

func (c liveCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	var authed []*session
	for ss, sl := range s.slots {
		if sl.authed {
			authed = append(authed, ss)
		}
	}
	handshakes, used := s.handshakes, s.mapped
	s.mu.Unlock()
	active := map[string]int{}
	for _, ss := range authed { // identity may take locks of its own: not under mu
		active[ss.identity()]++
	}
	for id, n := range active {
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(n), id)
	}
	ch <- prometheus.MustNewConstMetric(descHandshakes, prometheus.GaugeValue, float64(handshakes))
	ch <- prometheus.MustNewConstMetric(descBudgetUsed, prometheus.GaugeValue, float64(used))
	ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(s.cfg.WindowBudget))
}

// portCollector reads an RDMA device's port transmit counters from
// sysfs when scraped: device-wide, every user of the port counted.
type portCollector struct {
	dev   string
	ports []string // the ports' counter files
}

var descPortXmit = prometheus.NewDesc(ns+"_port_xmit_bytes_total", "Bytes the RDMA device's port transmitted (sysfs port_xmit_data × 4), device-wide: all traffic of the port, not only rdmacp's.", []string{"device", "port"}, nil)

// sysfsIB is where the kernel lists RDMA devices.
var sysfsIB = "/sys/class/infiniband"

// newPortCollector is nil for a device sysfs does not list (a software
// provider).
func newPortCollector(dev string) *portCollector {
	if dev == "" || strings.ContainsAny(dev, "/") {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(sysfsIB, dev, "ports", "*", "counters", "port_xmit_data"))
	if len(files) == 0 {
		return nil
	}
	return &portCollector{dev: dev, ports: files}
}

func (c *portCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descPortXmit }

func (c *portCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.ports {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		words, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		port := filepath.Base(filepath.Dir(filepath.Dir(f)))
		ch <- prometheus.MustNewConstMetric(descPortXmit, prometheus.CounterValue, float64(words)*4, c.dev, port)
	}
}
