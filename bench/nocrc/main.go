// Command nocrc runs rdmacp's READ bandwidth test (initiator.Session.Bench)
// between two processes over iwarp-soft with MPA CRC32c turned off on
// both sides (iwarp.Config.NoCRC), which rdmacp's commands don't offer.
// bench/report.sh uses it to show what the FPDU CRC costs:
//
//	nocrc serve -listen 127.0.0.1:9100 -export DIR
//	nocrc bench -connect 127.0.0.1:9100 -path data/FILE -q 4 -depth 4 -D 3s
//
// bench prints one JSON line: avg, min and peak MB/s and CPU s/GB of the
// initiator. -crc turns the CRC back on, for a like-for-like run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
	"github.com/rdmacp/rdmacp/verbs"
	"github.com/rdmacp/rdmacp/verbs/iwarp"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nocrc serve|bench [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	crc := fs.Bool("crc", false, "keep MPA CRC32c on")
	listen := fs.String("listen", "127.0.0.1:9100", "serve: address")
	export := fs.String("export", ".", "serve: directory exported as \"data\"")
	connect := fs.String("connect", "127.0.0.1:9100", "bench: target address")
	path := fs.String("path", "data/file", "bench: file to READ")
	qps := fs.Int("q", 4, "bench: queue pairs")
	depth := fs.Int("depth", 4, "bench: READs in flight per queue pair")
	size := fs.Int("s", 1<<20, "bench: bytes per READ")
	dur := fs.Duration("D", 3*time.Second, "bench: duration")
	fs.Parse(os.Args[2:])
	dev, err := iwarp.New(iwarp.Config{NoCRC: !*crc}).Open(ctx, verbs.DeviceConfig{})
	if err == nil {
		defer dev.Close()
		switch os.Args[1] {
		case "serve":
			err = serve(ctx, dev, *listen, *export)
		case "bench":
			err = bench(ctx, dev, *connect, *path, *qps, *depth, *size, *dur)
		default:
			err = fmt.Errorf("unknown command %q", os.Args[1])
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nocrc:", err)
		os.Exit(1)
	}
}

func serve(ctx context.Context, dev verbs.Device, addr, dir string) error {
	srv, err := target.New(target.Config{Device: dev, Exports: []target.Export{{Name: "data", Path: dir}}})
	if err != nil {
		return err
	}
	ln, err := dev.Listen(ctx, addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintln(os.Stderr, "listening", ln.Addr())
	return srv.Serve(ctx, ln)
}

func bench(ctx context.Context, dev verbs.Device, addr, path string, qps, depth, size int, d time.Duration) error {
	s, err := initiator.Dial(ctx, addr, initiator.Config{Device: dev, QPs: qps, Depth: depth})
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := s.Bench(ctx, path, initiator.BenchOptions{Size: size, Duration: d})
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(map[string]any{
		"transport": r.Transport, "qps": r.QPs, "depth": r.Depth, "bytes": r.Bytes,
		"avg_mb_per_s": r.Avg / 1e6, "min_mb_per_s": r.Min / 1e6, "peak_mb_per_s": r.Peak / 1e6,
		"cpu_seconds_per_gb": r.CPUPerGB,
	})
}
