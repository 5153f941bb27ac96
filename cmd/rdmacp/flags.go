package main

import (
	"fmt"
	"math"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/chunker"
	"github.com/rdmacp/rdmacp/initiator"
)

// initiatorFlags tune a session; cp, ls and bench share them.
func initiatorFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.IntFlag{Name: "qps", DefaultText: "auto: 4, up to 16 on a long path", Usage: "data queue pairs, fixed (1..64; the target may grant fewer)"},
		&cli.IntFlag{Name: "depth", DefaultText: "auto: starts at 4, grows with the path", Usage: "RDMA READs in flight per queue pair, fixed: no growth (1..1024; capped by what the connection negotiated)"},
		&cli.StringFlag{Name: "read-size", Value: "1MiB", Usage: "bytes per RDMA READ, fixed (4KiB..256MiB; capped by the chunk size)"},
		&cli.StringFlag{Name: "chunk-size", Usage: "bytes per verified chunk, a multiple of 4KiB up to 256MiB (default: the target's, 4MiB)"},
		&cli.StringFlag{Name: "digest", Value: "crc32c", Usage: "chunk digest: crc32c, blake3 or none (--checksum is rsync's -c)"},
		&cli.IntFlag{Name: "retries", Value: initiator.Defaults().Retries, Usage: "times a chunk that fails its digest is read again (0: never)"},
		bwlimitFlag("cap the RDMA READs over all queue pairs and rails together"),
		bindFlag(),
		allowRailFlag(),
		secretFlag(),
		identityFlag(),
	}, timeoutFlags()...)
}

// quietFlag is -q in every command: one meaning per letter across rdmacp.
func quietFlag() cli.Flag {
	return &cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}, Usage: "print nothing but errors and warnings (and the result asked for: a listing, a bench table)"}
}

// quiet reports -q: informational lines (the transport, summaries,
// banners) are left out.
func quiet(c *cli.Context) bool { return c.Bool("quiet") }

// sessionConfig is the one place the flags every command that dials
// shares (--secret-file, --identity, timeoutFlags) become a session's
// config, starting from initiator.Defaults; the session validates it.
func sessionConfig(c *cli.Context) (initiator.Config, error) {
	cfg := initiator.Defaults()
	var err error
	if cfg.Secret, err = readSecret(c); err != nil {
		return cfg, err
	}
	if cfg.Identity, err = identityOf(c); err != nil {
		return cfg, err
	}
	return cfg, timeoutConfig(c, &cfg)
}

// initiatorConfig is sessionConfig with initiatorFlags (cp, demo).
func initiatorConfig(c *cli.Context) (initiator.Config, error) {
	cfg, err := sessionConfig(c)
	if err != nil {
		return cfg, err
	}
	cfg.QPs, cfg.Depth, cfg.Retries = c.Int("qps"), c.Int("depth"), c.Int("retries")
	if cfg.Retries == 0 {
		cfg.Retries = initiator.NoRetries
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
		return cfg, digestError(c.String("digest"))
	}
	if cfg.BwLimit, err = parseRate(c.String("bwlimit")); err != nil {
		return cfg, usagef("--bwlimit: %v", err)
	}
	if err := railsConfig(c, &cfg); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// A limit is the range a numeric flag's value must be in. Zero is never
// taken for "the default": a flag left out has its default already.
type limit struct {
	kind     limitKind
	min, max int64 // for durations, in nanoseconds
	why      string
}

// noMax: no upper bound but the type's.
const noMax = math.MaxInt64

type limitKind int

const (
	intFlag     limitKind = iota // an IntFlag
	sizeFlag                     // a StringFlag read by parseSize
	chunkFlag                    // a chunk size: chunker.ValidateChunkSize
	secondsFlag                  // a StringFlag read by parseDuration: seconds or a Go duration
	neverFlag                    // as secondsFlag, and 0 means never
	goDurFlag                    // a DurationFlag
)

// flagLimits are the ranges of every numeric flag, by "command flag" or,
// where a name means the same in every command, by flag. The bounds are
// the initiator's and the target's own (initiator.Config.Validate,
// chunker.ValidateChunkSize, the verbs port and GID tables), checked here
// so that a bad value is a usage error before anything connects.
var flagLimits = map[string]limit{
	"qps":        {intFlag, 1, initiator.MaxQPs, "data queue pairs per session"},
	"depth":      {intFlag, 1, initiator.MaxDepth, "READs in flight per queue pair"},
	"read-size":  {sizeFlag, initiator.MinReadSize, chunker.MaxChunkSize, "a READ never spans chunks"},
	"chunk-size": {kind: chunkFlag},
	"retries":    {intFlag, 0, 1000, "0 means never retry"},
	"timeout":    {kind: secondsFlag, min: 1},
	"contimeout": {kind: secondsFlag, min: 1},
	"retry-for":  {kind: neverFlag},
	"ib-port":    {intFlag, 0, 255, "0 picks the first active port"},
	"gid-index":  {intFlag, -1, 255, "-1 picks a RoCE v2 GID"},

	"bench size":     {sizeFlag, 1, 1 << 31, "one READ moves at most 2GiB"},
	"bench iters":    {intFlag, 1, noMax, ""},
	"bench duration": {kind: secondsFlag, min: 1},
	"bench interval": {kind: secondsFlag, min: 1},
	"demo size":      {sizeFlag, 0, noMax, ""},

	"max-window":              {sizeFlag, chunker.MinChunkSize, noMax, "a window holds at least one chunk"},
	"window-budget":           {sizeFlag, chunker.MinChunkSize, noMax, ""},
	"min-window-share":        {sizeFlag, 1, noMax, ""},
	"max-digest-memory":       {sizeFlag, 1, noMax, ""},
	"idle-timeout":            {kind: goDurFlag, min: 1},
	"hello-timeout":           {kind: goDurFlag, min: 1},
	"max-sessions":            {intFlag, 1, noMax, ""},
	"max-sessions-per-addr":   {intFlag, 1, noMax, ""},
	"max-handshakes":          {intFlag, 1, noMax, ""},
	"max-handshakes-per-addr": {intFlag, 1, noMax, ""},
}

// checkFlags is every command's Before: the one place numeric flags are
// range-checked, before any transport opens or any connection is tried.
func checkFlags(c *cli.Context) error {
	if c.Command == nil {
		return nil
	}
	for _, f := range c.Command.Flags {
		name := f.Names()[0]
		l, ok := flagLimits[c.Command.Name+" "+name]
		if !ok {
			l, ok = flagLimits[name]
		}
		if !ok || !c.IsSet(name) {
			continue // a default: valid, or "not given" (bench's --iters 0)
		}
		if err := l.check(c, name, flagSpellings(f)); err != nil {
			return err
		}
	}
	return nil
}

func (l limit) check(c *cli.Context, name, flag string) error {
	switch l.kind {
	case intFlag:
		return l.inRange(flag, fmt.Sprint(c.Int(name)), int64(c.Int(name)), fmt.Sprint)
	case sizeFlag:
		v := c.String(name)
		n, err := parseSize(v)
		if err != nil {
			return usagef("%s: %v", flag, err)
		}
		return l.inRange(flag, v, n, func(a ...any) string { return sizeText(a[0].(int64)) })
	case chunkFlag:
		n, err := parseSize(c.String(name))
		if err == nil {
			err = chunker.ValidateChunkSize(n)
		}
		if err != nil {
			return usagef("%s %s: want a multiple of %s, %s to %s (e.g. 4MiB)", flag, c.String(name),
				sizeText(chunker.MinChunkSize), sizeText(chunker.MinChunkSize), sizeText(chunker.MaxChunkSize))
		}
	case secondsFlag, neverFlag:
		v := c.String(name)
		if l.kind == neverFlag && (v == "0" || v == "0s") {
			return nil
		}
		if _, err := parseDuration(v); err != nil {
			if l.kind == neverFlag {
				return usagef("%s %v (or 0: never)", flag, err)
			}
			return usagef("%s %v", flag, err)
		}
	case goDurFlag:
		if d := c.Duration(name); d <= 0 {
			return usagef("%s %v: want a duration above 0, such as 30s or 5m", flag, d)
		}
	}
	return nil
}

// inRange checks n (given as v) against [l.min, l.max].
func (l limit) inRange(flag, v string, n int64, show func(...any) string) error {
	if n >= l.min && n <= l.max {
		return nil
	}
	why := ""
	if l.why != "" {
		why = " (" + l.why + ")"
	}
	if l.max == noMax {
		return usagef("%s %s: want at least %s%s", flag, v, show(l.min), why)
	}
	return usagef("%s %s: want %s to %s%s", flag, v, show(l.min), show(l.max), why)
}

// sizeText is n as parseSize reads it back: 4KiB, 256MiB, 1000.
func sizeText(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return fmt.Sprint(n)
}

// digestError is the usage error for a --digest no digest has: the
// user's word and the ones there are, without chunker's "chunker:
// unknown digest algorithm" prefix (an internal package's name).
func digestError(value string) error {
	return usagef("--digest %q: want crc32c, blake3 or none", value)
}
