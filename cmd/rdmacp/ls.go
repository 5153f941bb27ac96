package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/rdmacp/rdmacp/escape"
	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

func lsCommand() *cli.Command {
	return &cli.Command{
		Name:      "ls",
		Usage:     "list a target's exports, or a directory of one",
		ArgsUsage: "HOST[:PORT][:EXPORT[/DIR]]",
		Description: "HOST or HOST: lists the target's exports; HOST:PORT (only digits after the colon) lists\n" +
			"them on that port; HOST:EXPORT/DIR lists a directory. An export named like a port is\n" +
			"HOST:7362/ or HOST:PORT:7362.",
		Flags: append([]cli.Flag{
			&cli.BoolFlag{Name: "long", Aliases: []string{"l"}, Usage: "mode, size and mtime too"},
			&cli.BoolFlag{Name: "json", Usage: "one JSON object per entry"},
			quietFlag(),
			secretFlag(),
			identityFlag(),
		}, append(timeoutFlags(), transportFlags()...)...),
		Action: runLs,
	}
}

func runLs(c *cli.Context) error {
	if c.NArg() != 1 {
		return usagef("ls wants one HOST[:PORT][:EXPORT[/DIR]] argument, got %d", c.NArg())
	}
	r, err := parseListTarget(c.Args().First())
	if err != nil {
		return usageError{err}
	}
	cfg, err := sessionConfig(c)
	if err != nil {
		return err
	}
	cfg.QPs, cfg.Depth = 1, 1 // a listing moves no data
	s, _, closeSession, err := dialSession(c, r.addr, cfg, c.Bool("json") || quiet(c))
	if err != nil {
		return err
	}
	defer closeSession()
	p := r.path
	if strings.HasSuffix(c.Args().First(), "/") && p != "" {
		p += "/" // DIR/ must be a directory, as for ls
	}
	ents, err := s.Ls(c.Context, p, initiator.LsOptions{Long: c.Bool("long") && !c.Bool("json")})
	var pe *fs.PathError
	if errors.As(err, &pe) {
		pe.Path = c.Args().First() // as the user typed it, host and all
	}
	if err != nil {
		return err
	}
	out := c.App.Writer
	enc := json.NewEncoder(out)
	for _, e := range ents {
		mt := time.Unix(0, e.MtimeNs).UTC().Format(time.RFC3339)
		switch {
		case c.Bool("json"):
			enc.Encode(entryLine{Message: "entry", Type: e.Type.String(), Name: e.Name, Mode: fmt.Sprintf("%04o", e.Mode), Size: e.Size, Mtime: mt, Target: e.Target,
				NameEscaped: lossless(e.Name), TargetEscaped: lossless(e.Target)})
		case c.Bool("long"):
			name := escape.String(e.Name)
			if e.Type == protocol.FileSymlink {
				name += " -> " + escape.String(e.Target)
			}
			fmt.Fprintf(out, "%s %12d %s %s\n", modeString(e.Type, e.Mode), e.Size, mt, name)
		default:
			name := escape.String(e.Name)
			if e.Type == protocol.FileDir {
				name += "/"
			}
			fmt.Fprintln(out, name)
		}
	}
	return nil
}

// modeString is ls -l's first column: the type and the permission bits,
// with setuid, setgid and sticky in the execute places (s, S, t, T).
// A type the target could not name (protocol.FileOther, or a value this
// build does not know) shows '?', as ls does for a type it can't name.
func modeString(t protocol.FileType, mode uint32) string {
	b := []byte("?rwxrwxrwx")
	if c, ok := typeLetter[t]; ok {
		b[0] = c
	}
	for i := range 9 {
		if mode&(1<<(8-i)) == 0 {
			b[1+i] = '-'
		}
	}
	special := func(bit uint32, at int, set byte) {
		if mode&bit == 0 {
			return
		}
		if b[at] == 'x' {
			b[at] = set
		} else {
			b[at] = set - 'a' + 'A'
		}
	}
	special(0o4000, 3, 's')
	special(0o2000, 6, 's')
	special(0o1000, 9, 't')
	return string(b)
}

// typeLetter is ls -l's letter for each file type.
var typeLetter = map[protocol.FileType]byte{
	protocol.FileRegular:  '-',
	protocol.FileDir:      'd',
	protocol.FileSymlink:  'l',
	protocol.FileBlockDev: 'b',
	protocol.FileCharDev:  'c',
	protocol.FileFIFO:     'p',
	protocol.FileSocket:   's',
}

// lossless is s as escape.String writes it when s is not valid UTF-8,
// and so would not survive JSON; "" otherwise.
func lossless(s string) string {
	if utf8.ValidString(s) {
		return ""
	}
	return escape.String(s)
}
