// Command gentree makes a tree of many small files fast (a shell loop
// takes minutes for a million): gentree -files N -per D -size B DIR puts N
// files of B bytes in directories of D files, d00000/f0000000 ...; every
// thousandth directory also gets a subdirectory, so the tree has depth.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

func main() {
	files := flag.Int("files", 100000, "number of files")
	per := flag.Int("per", 100, "files per directory")
	size := flag.Int("size", 1024, "bytes per file")
	workers := flag.Int("j", 4, "directories made at once")
	flag.Parse()
	if flag.NArg() != 1 || *per < 1 {
		fmt.Fprintln(os.Stderr, "usage: gentree [-files N] [-per D] [-size B] DIR")
		os.Exit(2)
	}
	root := flag.Arg(0)
	ndirs := (*files + *per - 1) / *per
	data := make([]byte, *size)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	fail := func(err error) { once.Do(func() { fmt.Fprintln(os.Stderr, "gentree:", err); os.Exit(1) }) }
	for range *workers {
		wg.Go(func() {
			for d := range next {
				dir := filepath.Join(root, fmt.Sprintf("d%05d", d))
				if d%1000 == 999 {
					dir = filepath.Join(root, fmt.Sprintf("d%05d", d-1), "sub")
				}
				if err := os.MkdirAll(dir, 0o755); err != nil {
					fail(err)
				}
				for f := d * *per; f < min((d+1)**per, *files); f++ {
					b := append([]byte(nil), data...)
					if len(b) >= 4 {
						b[0], b[1], b[2], b[3] = byte(f), byte(f>>8), byte(f>>16), byte(f>>24)
					}
					if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%07d", f)), b, 0o644); err != nil {
						fail(err)
					}
				}
			}
		})
	}
	for d := range ndirs {
		next <- d
	}
	close(next)
	wg.Wait()
}
