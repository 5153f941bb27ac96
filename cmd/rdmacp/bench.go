package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
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
			"interval, and the initiator's CPU seconds per GB. MB is 10^6 bytes, Gb 10^9 bits.\n" +
			"perftest's spellings work: -s, -n, -D, -a, -o/--outs, --report_gbits; its -q N is --qps N\n" +
			"(-q is quiet in every rdmacp command). As ib_read_bw, without -n or -D each queue pair\n" +
			"completes 1000 READs per size; -a sweeps the READ size from 2 bytes to 8MiB by powers of two\n" +
			"(FILE must be at least 8MiB for the last rows: larger READs than the window are not made).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "size", Aliases: []string{"s"}, Value: "1MiB", Usage: "bytes per RDMA READ"},
			&cli.BoolFlag{Name: "all", Aliases: []string{"a"}, Usage: "sweep READ sizes 2 bytes to 8MiB by powers of two, one row each (ib_read_bw -a)"},
			&cli.IntFlag{Name: "qps", DefaultText: "auto: 4, up to 16 on a long path", Usage: "data queue pairs, fixed (perftest's -q)"},
			&cli.IntFlag{Name: "depth", Aliases: []string{"o", "outs"}, DefaultText: "auto: starts at 4, grows with the path", Usage: "RDMA READs in flight per queue pair, fixed, perftest's -o/--outs (capped by what the connection negotiated)"},
			&cli.StringFlag{Name: "duration", Aliases: []string{"D"}, Usage: "how long to run each size: seconds, or a Go duration such as 500ms, instead of iterations"},
			&cli.IntFlag{Name: "iters", Aliases: []string{"n"}, Usage: fmt.Sprintf("READs per queue pair and size (default %d, as perftest)", benchIters)},
			&cli.StringFlag{Name: "interval", Value: "100ms", Usage: "slice of time the minimum and peak rates are taken over"},
			&cli.BoolFlag{Name: "report-gbits", Aliases: []string{"report_gbits"}, Usage: "report Gb/s instead of MB/s"},
			bwlimitFlag("cap the READs"),
			&cli.BoolFlag{Name: "json", Usage: "one JSON summary line per size on stdout (or an error line)"},
			quietFlag(),
			&cli.StringFlag{Name: "cpuprofile", Usage: "write a CPU profile of the test to FILE (go tool pprof)"},
			secretFlag(),
			identityFlag(),
		}, append(timeoutFlags(), transportFlags()...)...),
		Action: runBench,
	}
}

// parseDuration takes seconds, as perftest's -D, or a Go duration.
func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
		if !(f > 0 && f < float64(math.MaxInt64)/float64(time.Second)) { // NaN and Inf too
			return 0, fmt.Errorf("%q: want a positive duration, under 292 years", s)
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q: want seconds or a duration such as 500ms", s)
	}
	return d, nil
}

// benchIters is perftest's default -n: READs per QP and size.
const benchIters = 1000

// benchSizes are ib_read_bw -a's: 2 bytes to 8MiB by powers of two.
func benchSizes() []int {
	var sizes []int
	for n := 2; n <= 8<<20; n *= 2 {
		sizes = append(sizes, n)
	}
	return sizes
}

func runBench(c *cli.Context) error { return benchOne(c, c.App.Writer) }

// benchOptions reads the flags of one test; checkFlags has range-checked them.
func benchOptions(c *cli.Context) (initiator.BenchOptions, []int, error) {
	var opt initiator.BenchOptions
	var err error
	sizes := benchSizes()
	if c.Bool("all") {
		if c.IsSet("size") {
			return opt, nil, usagef("give -a (every size) or -s SIZE, not both")
		}
	} else {
		size, _ := parseSize(c.String("size"))
		sizes = []int{int(size)}
	}
	switch {
	case c.IsSet("duration") && c.IsSet("iters"):
		return opt, nil, usagef("give --duration (-D) or --iters (-n), not both")
	case c.IsSet("duration"):
		opt.Duration, _ = parseDuration(c.String("duration"))
	case c.IsSet("iters"):
		opt.Iters = c.Int("iters")
	default:
		opt.Iters = benchIters
	}
	if opt.Interval, err = parseDuration(c.String("interval")); err != nil {
		return opt, nil, usagef("--interval %v", err)
	}
	return opt, sizes, nil
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
	opt, sizes, err := benchOptions(c)
	if err != nil {
		return err
	}
	cfg, err := sessionConfig(c)
	if err != nil {
		return err
	}
	cfg.QPs, cfg.Depth = c.Int("qps"), c.Int("depth")
	if cfg.BwLimit, err = parseRate(c.String("bwlimit")); err != nil {
		return usagef("--bwlimit: %v", err)
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
	t := &benchTable{c: c, out: stdout, src: src, why: why, s: s}
	for i, size := range sizes {
		opt.Size = size
		res, err := s.Bench(ctx, src.path, opt)
		if err != nil {
			return err
		}
		if len(sizes) > 1 && res.Size < size {
			// The window (or the device) caps a READ: the rows left
			// would repeat this one.
			fmt.Fprintf(c.App.ErrWriter, "rdmacp: warning: READs of %d bytes and more were not made: the window of %s is %s (a larger FILE sweeps further)\n",
				size, src.path, formatBytes(res.Window))
			break
		}
		if err := t.row(res, i == 0); err != nil {
			return err
		}
	}
	t.end()
	return nil
}

// benchTable prints results as ib_read_bw does: a banner, then one row
// per size under perftest's columns (#bytes #iterations BW peak BW average
// MsgRate), with rdmacp's BW min and CPU after them; or JSON lines.
type benchTable struct {
	c     *cli.Context
	out   io.Writer
	src   remote
	why   string
	begun bool
	s     *initiator.Session
}

var benchRule = strings.Repeat("-", 96)

func (t *benchTable) unit() (string, func(float64) float64) {
	if t.c.Bool("report-gbits") {
		return "Gb/sec", func(r float64) float64 { return r * 8 / 1e9 }
	}
	return "MB/sec", func(r float64) float64 { return r / 1e6 }
}

func (t *benchTable) row(res *initiator.BenchResult, first bool) error {
	mb := func(r float64) float64 { return r / 1e6 }
	gb := func(r float64) float64 { return r * 8 / 1e9 }
	inf := t.s.InFlight()
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	if t.c.Bool("json") {
		iv := make([]float64, len(res.Intervals))
		for i, r := range res.Intervals {
			iv[i] = mb(r)
		}
		return json.NewEncoder(t.out).Encode(benchLine{Type: "summary", Status: "ok", Source: t.c.Args().First(),
			Transport: res.Transport, Choice: t.why, QPs: res.QPs, Depth: res.Depth, Size: res.Size, Window: res.Window,
			Reads: res.Reads, Bytes: res.Bytes, Seconds: res.Elapsed.Seconds(),
			AvgMBps: mb(res.Avg), MinMBps: mb(res.Min), PeakMBps: mb(res.Peak),
			AvgGbps: gb(res.Avg), MinGbps: gb(res.Min), PeakGbps: gb(res.Peak),
			IntervalMs: float64(res.Interval) / 1e6, Intervals: iv,
			CPUSeconds: res.CPU.Seconds(), CPUSecsPerGB: res.CPUPerGB, QPFailures: res.QPFailures,
			ConnectRTTms: ms(inf.ConnectRTT), ReadRTTms: ms(inf.RTT), Inflight: inf.Bytes, InflightStart: inf.Min, InflightMax: inf.Max})
	}
	unit, conv := t.unit()
	if first {
		t.begun = true
		if !quiet(t.c) {
			fmt.Fprintln(t.out, benchRule)
			fmt.Fprintf(t.out, "                    RDMA READ bandwidth test: %s\n", t.c.Args().First())
			fmt.Fprintf(t.out, " transport     : %s\n", res.Transport)
			fmt.Fprintf(t.out, " queue pairs   : %d, up to %d READs in flight each\n", res.QPs, res.Depth)
			fmt.Fprintf(t.out, " path          : RTT %.3f ms at connect, %.3f ms the fastest READ\n", ms(inf.ConnectRTT), ms(inf.RTT))
			fmt.Fprintf(t.out, " in flight     : %s settled (from %s, at most %s)\n", formatBytes(inf.Bytes), formatBytes(inf.Min), formatBytes(inf.Max))
			fmt.Fprintf(t.out, " window        : %s of %s\n", formatBytes(res.Window), t.src.path)
			fmt.Fprintf(t.out, " min and peak  : over %v intervals\n", res.Interval)
		}
		fmt.Fprintln(t.out, benchRule)
		fmt.Fprintf(t.out, " %-10s %-12s %-18s %-18s %-14s %-18s %s\n", "#bytes", "#iterations",
			"BW peak["+unit+"]", "BW average["+unit+"]", "MsgRate[Mpps]", "BW min["+unit+"]", "CPU[s/GB]")
	}
	fmt.Fprintf(t.out, " %-10d %-12d %-18.2f %-18.2f %-14.6f %-18.2f %.3f\n", res.Size, res.Reads,
		conv(res.Peak), conv(res.Avg), float64(res.Reads)/max(res.Elapsed.Seconds(), 1e-9)/1e6, conv(res.Min), res.CPUPerGB)
	return nil
}

func (t *benchTable) end() {
	if t.begun && !t.c.Bool("json") {
		fmt.Fprintln(t.out, benchRule)
	}
}
