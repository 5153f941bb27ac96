package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

func cpCommand() *cli.Command {
	return &cli.Command{
		Name:      "cp",
		Usage:     "copy a remote file to a local path",
		ArgsUsage: "HOST[:PORT]:EXPORT/PATH DEST",
		Description: "Pulls the file with RDMA READs striped over --qps queue pairs, verifies every chunk\n" +
			"against the target's digest (re-reading a chunk that fails), and renames the result into\n" +
			"place only when it is complete. DEST may be a directory.",
		Flags: append(append(initiatorFlags(), transportFlags()...),
			&cli.BoolFlag{Name: "json", Usage: "print JSON lines (status while running, one summary) on stdout"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "no progress bar"},
			&cli.BoolFlag{Name: "force", Aliases: []string{"f"}, Usage: "allow DEST to be a block device, overwritten in place (never a mounted one, or one smaller than the source)"},
		),
		Action: runCp,
	}
}

// initiatorFlags tune a session; cp, ls and bench share them.
func initiatorFlags() []cli.Flag {
	return []cli.Flag{
		&cli.IntFlag{Name: "qps", Value: 4, Usage: "data queue pairs"},
		&cli.IntFlag{Name: "depth", Value: 4, Usage: "RDMA READs in flight per queue pair"},
		&cli.StringFlag{Name: "read-size", Value: "1MiB", Usage: "bytes per RDMA READ"},
		&cli.StringFlag{Name: "chunk-size", Usage: "bytes per verified chunk (default: the target's, 4MiB)"},
		&cli.StringFlag{Name: "checksum", Value: "crc32c", Usage: "chunk digest: crc32c, blake3 or none"},
		&cli.IntFlag{Name: "retries", Value: 3, Usage: "times a chunk that fails its digest is read again"},
		secretFlag(),
	}
}

func initiatorConfig(c *cli.Context) (initiator.Config, error) {
	cfg := initiator.Config{QPs: c.Int("qps"), Depth: c.Int("depth"), Retries: c.Int("retries")}
	if c.Int("retries") == 0 {
		cfg.Retries = -1 // explicit zero: never retry
	}
	rs, err := parseSize(c.String("read-size"))
	if err != nil {
		return cfg, usagef("--read-size: %v", err)
	}
	cfg.ReadSize = int(rs)
	if s := c.String("chunk-size"); s != "" {
		if cfg.ChunkSize, err = parseSize(s); err != nil {
			return cfg, usagef("--chunk-size: %v", err)
		}
	}
	if cfg.Algorithm, err = chunker.ParseAlgorithm(c.String("checksum")); err != nil {
		return cfg, usagef("--checksum: %v", err)
	}
	if cfg.Secret, err = readSecret(c); err != nil {
		return cfg, err
	}
	return cfg, nil
}

type summaryLine struct {
	Type      string  `json:"message_type"`
	Status    string  `json:"status"`
	Source    string  `json:"source"`
	Dest      string  `json:"dest"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MBps      float64 `json:"mb_per_s"`
	Transport string  `json:"transport"`
	QPs       int     `json:"qps"`
	Depth     int     `json:"depth"`
	ChunkSize int64   `json:"chunk_size"`
	Retries   int     `json:"chunk_retries"`
	Digest    string  `json:"digest"`
}

type errorLine struct {
	Type     string `json:"message_type"`
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

func runCp(c *cli.Context) error {
	if c.NArg() != 2 {
		return usagef("cp wants SOURCE and DEST, got %d arguments", c.NArg())
	}
	err := copyOne(c, c.Args().Get(0), c.Args().Get(1), c.App.Writer)
	if err != nil && c.Bool("json") {
		json.NewEncoder(c.App.Writer).Encode(errorLine{Type: "error", Error: err.Error(), ExitCode: exitCode(c.Context, err)})
	}
	return err
}

func copyOne(c *cli.Context, srcArg, dst string, stdout io.Writer) error {
	ctx := c.Context
	src, ok, err := parseRemote(srcArg)
	if err != nil {
		return usageError{err}
	}
	if !ok {
		if _, isRemote, _ := parseRemote(dst); isRemote {
			return usagef("pushing to a target (LOCAL HOST:PATH) is not supported yet")
		}
		return usagef("%q is not a remote path: want HOST[:PORT]:EXPORT/PATH", srcArg)
	}
	cfg, err := initiatorConfig(c)
	if err != nil {
		return err
	}
	dev, why, err := openTransport(ctx, c)
	if err != nil {
		return err
	}
	defer dev.Close()
	jsonOut := c.Bool("json")
	if !jsonOut {
		fmt.Fprintln(c.App.ErrWriter, "transport:", why)
	}
	cfg.Device = dev
	s, err := initiator.Dial(ctx, src.addr, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	e, err := s.Stat(ctx, src.path)
	if err != nil {
		return err
	}
	if e.Type == protocol.FileDir {
		return &protocol.Error{Code: protocol.CodeIsDir, Message: src.path + " is a directory (copying trees with -r is not supported yet)"}
	}
	r := newRenderer(jsonOut, c.Bool("quiet"), stdout)
	res, err := s.Get(ctx, src.path, dst, initiator.GetOptions{Progress: r.update, Force: c.Bool("force")})
	r.finish()
	if err != nil {
		return err
	}
	secs := res.Elapsed.Seconds()
	mbps := float64(res.Bytes) / 1e6 / max(secs, 1e-9)
	if jsonOut {
		return json.NewEncoder(stdout).Encode(summaryLine{Type: "summary", Status: "ok", Source: srcArg, Dest: res.Dest,
			Bytes: res.Bytes, Seconds: secs, MBps: mbps, Transport: s.Transport(), QPs: s.DataQPs(), Depth: s.ReadsPerQP(),
			ChunkSize: res.ChunkSize, Retries: res.Retries, Digest: res.Digest})
	}
	fmt.Fprintf(stdout, "%s -> %s: %s in %.2fs (%.0f MB/s), %d QPs x %d READs, %s, %d chunk retries\n",
		srcArg, res.Dest, formatBytes(res.Bytes), secs, mbps, s.DataQPs(), s.ReadsPerQP(), res.Digest, res.Retries)
	return nil
}
