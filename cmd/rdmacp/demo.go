package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/target"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "start a target on loopback, copy a generated file from it, and check both sha256 sums",
		Flags: append(append([]cli.Flag{
			&cli.StringFlag{Name: "size", Value: "256MiB", Usage: "size of the generated file"},
			&cli.StringFlag{Name: "dir", Usage: "work directory (default: a new temporary one, removed after)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON lines on stdout"},
			quietFlag(),
		}, initiatorFlags()...), transportFlags()...),
		Action: runDemo,
	}
}

func runDemo(c *cli.Context) error {
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	if c.NArg() != 0 {
		return usagef("demo takes no arguments, got %d (%q)", c.NArg(), c.Args().First())
	}
	size, err := parseSize(c.String("size"))
	if err != nil {
		return usagef("--size: %v", err)
	}
	dir := c.String("dir")
	if dir == "" {
		if dir, err = os.MkdirTemp("", "rdmacp-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	exp := filepath.Join(dir, "export")
	if err := os.MkdirAll(exp, 0o755); err != nil {
		return err
	}
	src := filepath.Join(exp, "demo.bin")
	if err := writeRandom(src, size); err != nil {
		return err
	}
	if names := deviceNames(c); len(names) > 1 {
		return usagef("-d %s: the demo runs on one device (over loopback); name one", c.String("device"))
	}
	dev, why, err := openTransport(ctx, c)
	if err != nil {
		return err
	}
	defer dev.Close()
	srv, err := target.New(target.Config{Device: dev, Exports: []target.Export{{Name: "demo", Path: exp}}})
	if err != nil {
		return err
	}
	ln, err := dev.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("%w: %w", errTransport, err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	jsonOut := c.Bool("json")
	if !jsonOut && !quiet(c) {
		fmt.Fprintf(c.App.ErrWriter, "target: serving demo=%s on %s over %s\n", exp, ln.Addr(), why)
	}
	remote := ln.Addr() + ":demo/demo.bin"
	if err := copyOne(c, remote, filepath.Join(dir, "copy.bin"), c.App.Writer); err != nil {
		return err
	}
	cancel()
	<-served
	a, err := sha256File(src)
	if err != nil {
		return err
	}
	b, err := sha256File(filepath.Join(dir, "copy.bin"))
	if err != nil {
		return err
	}
	if jsonOut {
		if err := json.NewEncoder(c.App.Writer).Encode(demoLine{Type: "demo", Source: a, Copy: b, Identical: a == b}); err != nil {
			return err
		}
	}
	if a != b {
		return fmt.Errorf("%w: sha256 of the copy %s differs from the source's %s", initiator.ErrVerify, b, a)
	}
	if !jsonOut && !quiet(c) {
		fmt.Fprintf(c.App.Writer, "sha256 %s  source\nsha256 %s  copy: identical\n", a, b)
	}
	return nil
}

// writeRandom writes n pseudo-random bytes to path.
func writeRandom(path string, n int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var seed [32]byte
	for i := range seed {
		seed[i] = byte(rand.Uint32())
	}
	if _, err := io.CopyN(f, rand.NewChaCha8(seed), n); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
