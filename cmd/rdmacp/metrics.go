package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/urfave/cli/v2"
)

// `rdmacp serve --metrics-listen ADDR` serves the target's metrics in
// the Prometheus exposition format at /metrics, written by the
// reference client library (promhttp), and /healthz.

func metricsFlag() cli.Flag {
	return &cli.StringFlag{Name: "metrics-listen", Usage: "HOST:PORT to serve Prometheus metrics on (/metrics, and /healthz); off unless given. Plain HTTP: bind it to an address only your monitoring reaches"}
}

// listenMetrics binds addr ("": no metrics), before the target starts,
// so that a port in use fails the start as the target's own would.
func listenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, usagef("--metrics-listen %q: want HOST:PORT (e.g. 127.0.0.1:9362)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, listenError(addr, err)
	}
	return ln, nil
}

// serveMetrics answers on ln until ctx ends.
func serveMetrics(ctx context.Context, ln net.Listener, reg *prometheus.Registry, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		// The target answers while this process runs: Serve's loop and
		// this server end together.
		io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	log.Info("serving metrics", "addr", ln.Addr().String(), "paths", "/metrics /healthz")
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("metrics server stopped", "err", err)
	}
}
