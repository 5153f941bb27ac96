package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:      "bench",
		Usage:     "measure RDMA READ bandwidth from a target (like ib_read_bw)",
		ArgsUsage: "HOST[:PORT]:EXPORT/FILE",
		Description: "Opens FILE, maps one window of it (as large as the target allows, at most the file) and\n" +
			"READs it over and over into registered memory, keeping every queue pair at its depth: no\n" +
			"verification, nothing written to disk. Reports the average, the slowest and the fastest\n" +
			"interval, and the initiator's CPU seconds per GB. MB is 10^6 bytes, Gb 10^9 bits.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "size", Aliases: []string{"s"}, Value: "1MiB", Usage: "bytes per RDMA READ"},
			&cli.IntFlag{Name: "qps", Aliases: []string{"q"}, Value: 4, Usage: "data queue pairs"},
			&cli.IntFlag{Name: "depth", Value: 4, Usage: "RDMA READs in flight per queue pair (capped by what the connection negotiated)"},
			&cli.StringFlag{Name: "duration", Aliases: []string{"D"}, Usage: "how long to run: seconds, or a Go duration such as 500ms (default 5s)"},
			&cli.IntFlag{Name: "iters", Aliases: []string{"n"}, Usage: "READs per queue pair, instead of a duration"},
			&cli.StringFlag{Name: "interval", Value: "100ms", Usage: "slice of time the minimum and peak rates are taken over"},
			&cli.BoolFlag{Name: "report-gbits", Usage: "report Gb/s instead of MB/s"},
			&cli.BoolFlag{Name: "json", Usage: "one JSON summary line on stdout (or an error line)"},
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the test to FILE (go tool pprof)"},
			secretFlag(),
		}, append(timeoutFlags(), transportFlags()...)...),
		Action: runBench,
	}
}

type benchLine struct {
	Type         string    `json:"message_type"`
	Status       string    `json:"status"`
	Source       string    `json:"source"`
	Transport    string    `json:"transport"`
	Choice       string    `json:"transport_choice"`
	QPs          int       `json:"qps"`
	Depth        int       `json:"depth"`
	Size         int       `json:"read_size"`
	Window       int64     `json:"window"`
	Reads        int64     `json:"reads"`
	Bytes        int64     `json:"bytes"`
	Seconds      float64   `json:"seconds"`
	AvgMBps      float64   `json:"avg_mb_per_s"`
	MinMBps      float64   `json:"min_mb_per_s"`
	PeakMBps     float64   `json:"peak_mb_per_s"`
	AvgGbps      float64   `json:"avg_gbit_per_s"`
	MinGbps      float64   `json:"min_gbit_per_s"`
	PeakGbps     float64   `json:"peak_gbit_per_s"`
	IntervalMs   float64   `json:"interval_ms"`
	Intervals    []float64 `json:"intervals_mb_per_s"`
	CPUSeconds   float64   `json:"cpu_seconds"`
	CPUSecsPerGB float64   `json:"cpu_seconds_per_gb"`
	QPFailures   int       `json:"qp_failures"`
}

// parseDuration takes seconds, as perftest's -D, or a Go duration.
func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
		if f <= 0 {
			return 0, fmt.Errorf("%q: want a positive duration", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want seconds or a duration such as 500ms", s)
	}
	return d, nil
}

func runBench(c *cli.Context) error {
	err := benchOne(c, c.App.Writer)
	if err != nil && c.Bool("json") {
		json.NewEncoder(c.App.Writer).Encode(errorLine{Type: "error", Error: err.Error(), ExitCode: exitCode(c.Context, err)})
	}
	return err
}

func benchOne(c *cli.Context, stdout io.Writer) error {
	ctx := c.Context
	if c.NArg() != 1 {
		return usagef("bench wants one HOST[:PORT]:EXPORT/FILE argument, got %d", c.NArg())
	}
	src, ok, err := parseRemote(c.Args().First())
	if err != nil {
		return usageError{err}
	}
	if !ok || src.path == "" {
		return usagef("%q is not a remote file: want HOST[:PORT]:EXPORT/FILE", c.Args().First())
	}
	size, err := parseSize(c.String("size"))
	if err != nil || size < 1 || size > 1<<31 {
		return usagef("--size %q: want 1 byte to 2GiB", c.String("size"))
	}
	opt := initiator.BenchOptions{Size: int(size), Iters: c.Int("iters")}
	if opt.Iters < 0 {
		return usagef("--iters %d: want a positive count", opt.Iters)
	}
	if c.IsSet("duration") {
		if c.IsSet("iters") {
			return usagef("give --duration or --iters, not both")
		}
		if opt.Duration, err = parseDuration(c.String("duration")); err != nil {
			return usagef("--duration %v", err)
		}
	}
	if opt.Interval, err = parseDuration(c.String("interval")); err != nil {
		return usagef("--interval %v", err)
	}
	secret, err := readSecret(c)
	if err != nil {
		return err
	}
	cfg := initiator.Config{Secret: secret, QPs: c.Int("qps"), Depth: c.Int("depth")}
	if cfg.QPs < 1 || cfg.QPs > 64 || cfg.Depth < 1 || cfg.Depth > 1024 {
		return usagef("--qps %d --depth %d: want 1..64 queue pairs and 1..1024 READs each", cfg.QPs, cfg.Depth)
	}
	if err := timeoutConfig(c, &cfg); err != nil {
		return err
	}
	jsonOut := c.Bool("json")
	s, why, closeSession, err := dialSession(c, src.addr, cfg, jsonOut)
	if err != nil {
		return err
	}
	defer closeSession()
	e, err := s.Stat(ctx, src.path)
	if err != nil {
		return err
	}
	if e.Type == protocol.FileDir {
		return &protocol.Error{Code: protocol.CodeIsDir, Message: src.path + " is a directory"}
	}
	if p := c.String("cpuprofile"); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res, err := s.Bench(ctx, src.path, opt)
	if err != nil {
		return err
	}
	mb := func(r float64) float64 { return r / 1e6 }
	gb := func(r float64) float64 { return r * 8 / 1e9 }
	if jsonOut {
		iv := make([]float64, len(res.Intervals))
		for i, r := range res.Intervals {
			iv[i] = mb(r)
		}
		return json.NewEncoder(stdout).Encode(benchLine{Type: "summary", Status: "ok", Source: c.Args().First(),
			Transport: res.Transport, Choice: why, QPs: res.QPs, Depth: res.Depth, Size: res.Size, Window: res.Window,
			Reads: res.Reads, Bytes: res.Bytes, Seconds: res.Elapsed.Seconds(),
			AvgMBps: mb(res.Avg), MinMBps: mb(res.Min), PeakMBps: mb(res.Peak),
			AvgGbps: gb(res.Avg), MinGbps: gb(res.Min), PeakGbps: gb(res.Peak),
			IntervalMs: float64(res.Interval) / 1e6, Intervals: iv,
			CPUSeconds: res.CPU.Seconds(), CPUSecsPerGB: res.CPUPerGB, QPFailures: res.QPFailures})
	}
	unit, conv := "MB/sec", mb
	if c.Bool("report-gbits") {
		unit, conv = "Gb/sec", gb
	}
	line := strings.Repeat("-", 96)
	fmt.Fprintln(stdout, line)
	fmt.Fprintf(stdout, "                    RDMA READ bandwidth test: %s\n", c.Args().First())
	fmt.Fprintf(stdout, " transport     : %s\n", res.Transport)
	fmt.Fprintf(stdout, " queue pairs   : %d, %d READs in flight each\n", res.QPs, res.Depth)
	fmt.Fprintf(stdout, " window        : %s of %s, READ size %d\n", formatBytes(res.Window), src.path, res.Size)
	fmt.Fprintf(stdout, " min and peak  : over %v intervals\n", res.Interval)
	fmt.Fprintln(stdout, line)
	fmt.Fprintf(stdout, " %-10s %-12s %-18s %-18s %-18s %-14s %s\n", "#bytes", "#iterations",
		"BW peak["+unit+"]", "BW average["+unit+"]", "BW min["+unit+"]", "MsgRate[Mpps]", "CPU[s/GB]")
	fmt.Fprintf(stdout, " %-10d %-12d %-18.2f %-18.2f %-18.2f %-14.6f %.3f\n", res.Size, res.Reads,
		conv(res.Peak), conv(res.Avg), conv(res.Min), float64(res.Reads)/max(res.Elapsed.Seconds(), 1e-9)/1e6, res.CPUPerGB)
	fmt.Fprintln(stdout, line)
	return nil
}
