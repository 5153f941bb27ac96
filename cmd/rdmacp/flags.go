package main

import (
	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
)

// initiatorFlags tune a session; cp, ls and bench share them.
func initiatorFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.IntFlag{Name: "qps", Value: 4, Usage: "data queue pairs"},
		&cli.IntFlag{Name: "depth", Value: 4, Usage: "RDMA READs in flight per queue pair"},
		&cli.StringFlag{Name: "read-size", Value: "1MiB", Usage: "bytes per RDMA READ"},
		&cli.StringFlag{Name: "chunk-size", Usage: "bytes per verified chunk (default: the target's, 4MiB)"},
		&cli.StringFlag{Name: "digest", Value: "crc32c", Usage: "chunk digest: crc32c, blake3 or none (--checksum is rsync's -c)"},
		&cli.IntFlag{Name: "retries", Value: 3, Usage: "times a chunk that fails its digest is read again"},
		secretFlag(),
	}, timeoutFlags()...)
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
	if cfg.Algorithm, err = chunker.ParseAlgorithm(c.String("digest")); err != nil {
		return cfg, usagef("--digest: %v", err)
	}
	if cfg.Secret, err = readSecret(c); err != nil {
		return cfg, err
	}
	if err := timeoutConfig(c, &cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}
