package main

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// urfave/cli stops parsing flags at the first operand and knows nothing
// of getopt's bundles with values (-n20), so argv is put in its shape
// first: normalizeArgs reads it as getopt_long does, with the command's
// own flag definitions, and hands urfave the command, then every flag
// (one per word, a value joined with =), then "--" and the operands.
// Every mistake it finds is a usage error naming the nearest valid
// spelling.

// normalizeArgs rewrites argv (program name first) for app. "help CMD"
// becomes "CMD --help". Flags given before the command name go to the
// command.
func normalizeArgs(app *cli.App, argv []string) ([]string, error) {
	if len(argv) < 2 {
		return argv, nil
	}
	prog, rest := argv[0], argv[1:]
	// Flags before the command: the app's own (--help, --version) when
	// no command follows; the command's otherwise.
	i := 0
	for i < len(rest) && strings.HasPrefix(rest[i], "-") && rest[i] != "-" && rest[i] != "--" {
		if valueNext(app, rest[i]) {
			i++ // "--qps 2 cp": 2 is --qps's, not the command
		}
		i++
	}
	if i == len(rest) || rest[i] == "--" {
		for _, f := range rest[:i] {
			switch f {
			case "-h", "--help", "-v", "--version":
			default:
				return nil, usagef("unknown flag %s: rdmacp itself takes only --help and --version; a command's flags go with it (rdmacp help)", f)
			}
		}
		return argv, nil
	}
	name, before, after := rest[i], rest[:i], rest[i+1:]
	if name == "help" {
		return helpArgs(app, prog, append(slices.Clone(before), after...))
	}
	cmd := findCommand(app, name)
	if cmd == nil {
		return nil, unknownCommand(app, name)
	}
	words := append(slices.Clone(before), after...)
	flags, operands, err := splitArgs(cmd, words)
	if err != nil {
		return nil, err
	}
	out := append([]string{prog, name}, flags...)
	if slices.Contains(flags, "--help") || slices.Contains(flags, "-h") {
		return []string{prog, name, "--help"}, nil // help, whatever else was typed
	}
	if len(operands) > 0 {
		out = append(append(out, "--"), operands...)
	}
	return out, nil
}

// helpArgs turns "help [CMD]" into "CMD --help" (or the app's --help).
func helpArgs(app *cli.App, prog string, args []string) ([]string, error) {
	var names []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") {
			names = append(names, a)
		}
	}
	switch {
	case len(names) == 0:
		return []string{prog, "--help"}, nil
	case len(names) > 1:
		return nil, usagef("help wants one command, got %d: rdmacp help %s", len(names), names[0])
	case findCommand(app, names[0]) == nil:
		return nil, unknownCommand(app, names[0])
	}
	return []string{prog, names[0], "--help"}, nil
}

func findCommand(app *cli.App, name string) *cli.Command {
	for _, c := range app.Commands {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

func unknownCommand(app *cli.App, name string) error {
	var names []string
	for _, c := range app.Commands {
		if !c.Hidden {
			names = append(names, c.Names()...)
		}
	}
	if s := nearest(name, names); s != "" {
		return usagef("unknown command %q: did you mean %q?", name, s)
	}
	return usagef("unknown command %q: want one of %s (rdmacp help)", name, strings.Join(names, ", "))
}

// flagIndex finds a command's flags by every name they have, --help's too.
type flagIndex map[string]cli.Flag

func indexFlags(cmd *cli.Command) flagIndex {
	ix := flagIndex{}
	for _, f := range append(slices.Clone(cmd.Flags), cli.HelpFlag) {
		for _, n := range f.Names() {
			ix[n] = f
		}
	}
	return ix
}

// valueNext reports whether word, a flag given before the command name,
// takes the next word as its value: a long flag, or a one-letter one
// alone, without "=", that takes a value in any command.
func valueNext(app *cli.App, word string) bool {
	name := strings.TrimLeft(word, "-")
	if strings.Contains(name, "=") || (!strings.HasPrefix(word, "--") && len(name) > 1) {
		return false
	}
	for _, cmd := range app.Commands {
		if f, ok := indexFlags(cmd)[name]; ok && takesValue(f) {
			return true
		}
	}
	return false
}

func takesValue(f cli.Flag) bool {
	v, ok := f.(cli.DocGenerationFlag)
	return ok && v.TakesValue()
}

// splitArgs sorts a command's words into flags and operands, getopt_long's
// way: "--name", "--name=v", "--name v"; "-abc" is -a -b -c, and a letter
// that takes a value takes the rest of the word or the next one (-n20,
// -n 20); a lone "-" is an operand; "--" ends the flags. A word that names
// a long flag with one dash (-qps) is that flag, as Go's flag package has it.
func splitArgs(cmd *cli.Command, words []string) (flags, operands []string, err error) {
	ix := indexFlags(cmd)
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "--":
			return flags, append(operands, words[i+1:]...), nil
		case w == "-" || !strings.HasPrefix(w, "-"):
			operands = append(operands, w)
			continue
		}
		var next *string
		if i+1 < len(words) {
			next = &words[i+1]
		}
		got, used, err := readFlag(cmd, ix, w, next)
		if err != nil {
			return nil, nil, err
		}
		flags = append(flags, got...)
		if used {
			i++
		}
	}
	return flags, operands, nil
}

// readFlag reads the flag word w (and next, if it is w's value: used).
func readFlag(cmd *cli.Command, ix flagIndex, w string, next *string) (out []string, used bool, err error) {
	long := strings.HasPrefix(w, "--")
	body := strings.TrimLeft(w, "-")
	name, val, hasVal := strings.Cut(body, "=")
	if _, ok := ix[name]; !long && (len(name) == 1 || !ok) {
		return readShorts(cmd, ix, body, next)
	}
	f, ok := ix[name]
	if !ok {
		return nil, false, unknownFlag(cmd, ix, "--"+name)
	}
	dash := flagDash(name)
	if !takesValue(f) {
		if hasVal {
			if _, err := strconv.ParseBool(val); err != nil {
				return nil, false, noValue(cmd, dash+name, val)
			}
			return []string{dash + name + "=" + val}, false, nil
		}
		if err := oldSpelling(cmd, f, dash+name, next); err != nil {
			return nil, false, err
		}
		return []string{dash + name}, false, nil
	}
	if !hasVal {
		if next == nil {
			return nil, false, needsValue(cmd, dash+name, f)
		}
		val, used = *next, true
	}
	if err := checkValue(f, dash+name, val); err != nil {
		return nil, false, err
	}
	return []string{dash + name + "=" + val}, used, nil
}

// readShorts reads a bundle of one-letter flags: "rq", "avP", "n20", "s=4K".
func readShorts(cmd *cli.Command, ix flagIndex, body string, next *string) (out []string, used bool, err error) {
	for j := 0; j < len(body); j++ {
		l := body[j : j+1]
		f, ok := ix[l]
		if !ok {
			return nil, false, unknownFlag(cmd, ix, "-"+l)
		}
		if !takesValue(f) {
			if j == len(body)-1 {
				if err := oldSpelling(cmd, f, "-"+l, next); err != nil {
					return nil, false, err
				}
			}
			out = append(out, "-"+l)
			continue
		}
		val := strings.TrimPrefix(body[j+1:], "=")
		if j == len(body)-1 {
			if next == nil {
				return nil, false, needsValue(cmd, "-"+l, f)
			}
			val, used = *next, true
		}
		if err := checkValue(f, "-"+l, val); err != nil {
			return nil, false, err
		}
		return append(out, "-"+l+"="+val), used, nil
	}
	return out, false, nil
}

func flagDash(name string) string {
	if len(name) == 1 {
		return "-"
	}
	return "--"
}

// checkValue checks a value's type (ranges are checkFlags'), so that a
// word meant as a number is never taken for something else.
func checkValue(f cli.Flag, name, val string) error {
	var err error
	want := ""
	switch f.(type) {
	case *cli.IntFlag, *cli.Int64Flag:
		_, err = strconv.ParseInt(val, 0, 64)
		want = "a whole number"
	case *cli.UintFlag, *cli.Uint64Flag:
		_, err = strconv.ParseUint(val, 0, 64)
		want = "a whole number"
	case *cli.Float64Flag:
		_, err = strconv.ParseFloat(val, 64)
		want = "a number"
	case *cli.DurationFlag:
		_, err = time.ParseDuration(val)
		want = "a duration such as 30s or 5m"
	}
	if err != nil {
		return usagef("%s %q: want %s", name, val, want)
	}
	return nil
}

func unknownFlag(cmd *cli.Command, ix flagIndex, given string) error {
	var names []string
	for n := range ix {
		if len(n) > 1 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	// Any letter is one edit from any other: no guess for a short flag.
	if s := nearest(strings.TrimLeft(given, "-"), names); s != "" && len(given) > 2 {
		return usagef("%s: unknown flag %s: did you mean %s%s? (rdmacp help %s)", cmd.Name, given, flagDash(s), s, cmd.Name)
	}
	return usagef("%s: unknown flag %s (rdmacp help %s lists them)", cmd.Name, given, cmd.Name)
}

func needsValue(cmd *cli.Command, name string, f cli.Flag) error {
	usage := ""
	if d, ok := f.(cli.DocGenerationFlag); ok {
		usage = ": " + strings.ReplaceAll(d.GetUsage(), "`", "")
	}
	return usagef("%s: %s needs a value%s", cmd.Name, name, usage)
}

func noValue(cmd *cli.Command, name, val string) error {
	if name == "--checksum" || name == "-c" {
		return oldChecksum(name, val)
	}
	return usagef("%s: %s takes no value (got %q): give %s alone", cmd.Name, name, val, name)
}

// oldSpelling refuses a boolean flag followed by a value it used to take,
// or takes in another tool, rather than read the value as an operand.
func oldSpelling(cmd *cli.Command, f cli.Flag, name string, next *string) error {
	if next == nil {
		return nil
	}
	switch {
	case f.Names()[0] == "checksum" && isAlgorithm(*next):
		return oldChecksum(name, *next)
	case cmd.Name == "bench" && f.Names()[0] == "quiet" && isNumber(*next):
		return usagef("bench: -q is quiet in rdmacp; perftest's -q %s is --qps %s", *next, *next)
	}
	return nil
}

func oldChecksum(name, alg string) error {
	return usagef("%s takes no value: it is rsync's -c (skip files whose digest matches); the chunk digest algorithm is --digest %s", name, alg)
}

func isAlgorithm(s string) bool {
	switch strings.ToLower(s) {
	case "crc32c", "blake3", "none":
		return true
	}
	return false
}

func isNumber(s string) bool {
	_, err := strconv.Atoi(s)
	return err == nil
}

// nearest is the candidate closest to s: one it is a prefix of, else the
// least edit distance, if that is at most a third of s (at least 1).
func nearest(s string, candidates []string) string {
	var prefixed []string
	for _, c := range candidates {
		if len(s) > 1 && strings.HasPrefix(c, s) {
			prefixed = append(prefixed, c)
		}
	}
	if len(prefixed) > 0 {
		slices.SortFunc(prefixed, func(a, b string) int { return len(a) - len(b) })
		return prefixed[0]
	}
	best, bestD := "", max(1, len(s)/3)+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein (optimal string alignment)
// distance: a swapped pair of letters counts as one edit.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// jsonWanted reports whether argv asks for --json (before any "--"), so
// that a usage error found before the command runs is a JSON line too.
func jsonWanted(argv []string) bool {
	for _, a := range argv {
		switch {
		case a == "--":
			return false
		case a == "--json" || a == "--json=true":
			return true
		}
	}
	return false
}

// flagSpellings is a flag's names with their dashes, for messages:
// "--iters/-n".
func flagSpellings(f cli.Flag) string {
	var s []string
	for _, n := range f.Names() {
		s = append(s, flagDash(n)+n)
	}
	return strings.Join(s, "/")
}
