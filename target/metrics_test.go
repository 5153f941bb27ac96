package target_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
)

// serveSrv is serve that also returns the Server, for its metrics.
func serveSrv(t *testing.T, cfg target.Config) (*target.Server, string) {
	t.Helper()
	cfg.Device = device(t)
	srv, err := target.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := cfg.Device.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; ln.Close() })
	return srv, ln.Addr()
}

// metric is the value of name's sample with labels (-1: none).
func metric(t *testing.T, srv *target.Server, name string, labels ...string) float64 {
	t.Helper()
	fams, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// eventually waits up to 5 s for metric name to be want.
func eventually(t *testing.T, srv *target.Server, want float64, name string, labels ...string) {
	t.Helper()
	var got float64
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if got = metric(t, srv, name, labels...); got == want {
			return
		}
	}
	t.Errorf("%s%v = %v, want %v", name, labels, got, want)
}

func TestMetricsCountWindowsAndBusy(t *testing.T) {
	cfg, _ := exportFile(t, 64<<10)
	cfg.MaxWindow, cfg.WindowBudget = 32<<10, 32<<10
	cfg.RevokeAfter = time.Hour
	srv, addr := serveSrv(t, cfg)
	a := newPeer(t, addr)
	ha, wa := a.mapFile("data/f", 32<<10)
	if st := a.read(wa.Addr, wa.RKeys[0], 4096); st != verbs.StatusSuccess {
		t.Fatal(st)
	}
	eventually(t, srv, 1, "rdmacp_windows_mapped")
	eventually(t, srv, 32<<10, "rdmacp_window_budget_used_bytes")
	eventually(t, srv, 32<<10, "rdmacp_served_bytes_total", "export", "data", "identity", "default")
	eventually(t, srv, 1, "rdmacp_files_opened_total", "export", "data")
	b := newPeer(t, addr)
	eventually(t, srv, 2, "rdmacp_sessions_active", "identity", "default")
	m, _ := b.call(&protocol.Open{Path: "data/f"})
	hb := m.(*protocol.OpenReply).Handle
	_, err := b.call(&protocol.Map{Handle: hb, Length: 32 << 10})
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Code != protocol.CodeTooMany {
		t.Fatalf("map over the budget: %v", err)
	}
	eventually(t, srv, 1, "rdmacp_refusals_total", "reason", "busy")
	eventually(t, srv, 1, "rdmacp_request_errors_total", "code", "too_many")
	a.call(&protocol.Unmap{Handle: ha, WindowID: wa.ID})
	eventually(t, srv, 0, "rdmacp_windows_mapped")
	eventually(t, srv, 0, "rdmacp_window_budget_used_bytes")
	// The READ's bytes, counted by the iwarp QP, gathered at the unmap.
	eventually(t, srv, 4096, "rdmacp_read_response_bytes_total", "identity", "default")
	eventually(t, srv, 2, "rdmacp_sessions_total", "identity", "default")
}

func TestMetricsCountLimitRefusals(t *testing.T) {
	cfg, _ := exportFile(t, 4096)
	cfg.MaxSessions = 1
	srv, addr := serveSrv(t, cfg)
	newPeer(t, addr)
	if _, err := rawSession(t, addr, protocol.ControlData()); err == nil {
		t.Fatal("a second session was admitted with MaxSessions 1")
	}
	eventually(t, srv, 1, "rdmacp_refusals_total", "reason", "limits")
	eventually(t, srv, 0, "rdmacp_handshakes_in_progress")
}

// logBuffer collects JSON log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) lines(t *testing.T) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, m)
	}
	return out
}

func (l *logBuffer) find(t *testing.T, msg string) []map[string]any {
	var out []map[string]any
	for _, m := range l.lines(t) {
		if strings.Contains(m["msg"].(string), msg) {
			out = append(out, m)
		}
	}
	return out
}

func TestAccessLog(t *testing.T) {
	cfg, _ := exportFile(t, 64<<10)
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	_, addr := serveSrv(t, cfg)
	a := newPeer(t, addr)
	h, _ := a.mapFile("data/f", 64<<10)
	if _, err := a.call(&protocol.Close{Handle: h}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := a.call(&protocol.Open{Path: "data/nope"}); err == nil {
			t.Fatal("open of a missing file succeeded")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.ch.Send(ctx, &protocol.Bye{})
	var closed []map[string]any
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && len(closed) == 0; time.Sleep(10 * time.Millisecond) {
		closed = logs.find(t, "session closed")
	}
	served := logs.find(t, "served")
	if len(served) != 1 {
		t.Fatalf("served lines: %v", served)
	}
	s := served[0]
	if s["level"] != "INFO" || s["export"] != "data" || s["path"] != "data/f" || s["alg"] != "crc32c" ||
		s["bytes"] != float64(64<<10) || s["result"] != "ok" || s["identity"] != "default" || s["peer"] == nil || s["duration"] == nil {
		t.Errorf("served line: %v", s)
	}
	nf := logs.find(t, "not found")
	if len(nf) != 1 || nf[0]["level"] != "INFO" || !strings.Contains(nf[0]["err"].(string), "data/nope") {
		t.Errorf("not-found lines (one, at info, the rest aggregated): %v", nf)
	}
	if len(closed) != 1 || closed[0]["bytes"] != float64(64<<10) || closed[0]["files"] != 1.0 || closed[0]["reason"] != "closed by the initiator" {
		t.Errorf("session closed lines: %v", closed)
	}
}
