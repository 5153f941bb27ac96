package main

import (
	"errors"
	"strings"
	"testing"
)

func TestNormalizeArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"cp SRC DEST -r", "cp -r -- SRC DEST"},
		{"cp -r SRC DEST", "cp -r -- SRC DEST"},
		{"cp SRC -r DEST --qps 2", "cp -r --qps=2 -- SRC DEST"},
		{"cp -rq SRC DEST", "cp -r -q -- SRC DEST"},
		{"cp SRC DEST -qr --depth=2", "cp -q -r --depth=2 -- SRC DEST"},
		{"-r cp SRC DEST --read-size 64K", "cp -r --read-size=64K -- SRC DEST"},
		{"--qps 2 cp -r SRC DEST", "cp --qps=2 -r -- SRC DEST"},
		{"cp -rc --qps=3 SRC DEST", "cp -r -c --qps=3 -- SRC DEST"},
		{"cp SRC DEST -- -x", "cp -- SRC DEST -x"},
		{"cp -- -r DEST", "cp -- -r DEST"},
		{"cp --from - -q", "cp --from=- -q"},
		{"cp --gid-index -1 S D", "cp --gid-index=-1 -- S D"},
		{"cp -x -1 S D", "cp -x=-1 -- S D"},
		{"bench -n20 -s64K H:e/f", "bench -n=20 -s=64K -- H:e/f"},
		{"bench -qn 20 H:e/f", "bench -q -n=20 -- H:e/f"},
		{"bench -s=4K H:e/f", "bench -s=4K -- H:e/f"},
		{"bench -qps 2 H:e/f", "bench --qps=2 -- H:e/f"},
		{"bench --report_gbits -a -o 8 H:e/f", "bench --report_gbits -a -o=8 -- H:e/f"},
		{"-q ls H", "ls -q -- H"},
		{"help cp", "cp --help"},
		{"help", "--help"},
		{"cp --help S D", "cp --help"},
		{"--version", "--version"},
		{"cp --json=false S D", "cp --json=false -- S D"},
		{"serve -e a=/x -e b=/y", "serve -e=a=/x -e=b=/y"},
	} {
		got, err := normalizeArgs(newApp(), append([]string{"rdmacp"}, strings.Fields(tc.in)...))
		if err != nil {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if g := strings.Join(got[1:], " "); g != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, g, tc.want)
		}
	}
}

func TestNormalizeArgsErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"cpp S D", `unknown command "cpp": did you mean "cp"?`},
		{"bnech H", `did you mean "bench"?`},
		{"frobnicate", `unknown command "frobnicate": want one of serve, cp`},
		{"help cpp", `did you mean "cp"?`},
		{"cp --recursiv S D", "unknown flag --recursiv: did you mean --recursive?"},
		{"cp --recurse S D", "did you mean --recursive?"},
		{"cp --qsp 2 S D", "did you mean --qps?"},
		{"cp -rz S D", "unknown flag -z"},
		{"cp S D --qps", "--qps needs a value"},
		{"cp --qps zero S D", `--qps "zero": want a whole number`},
		{"cp --json=yes S D", "--json takes no value"},
		{"cp --checksum crc32c S D", "--digest crc32c"},
		{"cp -c blake3 S D", "--digest blake3"},
		{"cp --checksum=none S D", "--digest none"},
		{"bench -q 4 H:e/f", "perftest's -q 4 is --qps 4"},
		{"serve --idle-timeout soon", `--idle-timeout "soon": want a duration`},
		{"--frob", "unknown flag --frob"},
	} {
		_, err := normalizeArgs(newApp(), append([]string{"rdmacp"}, strings.Fields(tc.in)...))
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want a one-line usage error with %q", tc.in, err, tc.want)
		}
	}
}

func TestParseRemoteRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		// 1: local paths.
		{"relative/path", "local"},
		{"./local:file", "local"},
		{"dir/a:b", "local"},
		// 2: bracketed v6 hosts.
		{"[::1]:data/f", "[::1]:7362 data/f"},
		{"[::1]:99:data", "[::1]:99 data"},
		{"[::1]data", "error want [HOST]"},
		{"[::1:data", "error missing ]"},
		// 3: no remote users.
		{"root@localhost:data/f", `error drop "root@"`},
		{"me@[::1]:data", `error drop "me@"`},
		// 4: ports.
		{"host:9000:data/f", "host:9000 data/f"},
		{"host:7362", "host:7362 "},
		{"host:7362/", "host:7362 7362"},
		{"host:7362:7362", "host:7362 7362"},
		{"host:0:x", "error bad port"},
		{"host:70000", "error bad port"},
		// 5: the default port.
		{"host:data/f", "host:7362 data/f"},
		{"host:/data/dir/", "host:7362 data/dir"},
		{"host:data/a:b", "host:7362 data/a:b"},
		{"10.0.0.1:", "10.0.0.1:7362 "},
		{":data", "error empty host"},
		// Old habits get a hint, not a puzzle.
		{"host::module/f", "error rsync's daemon syntax; rdmacp's is HOST:EXPORT/PATH (host:module/f)"},
		{"::1:data/f", "error in brackets: [::1]:data/f"},
		{"fe80::1:data", "error in brackets: [fe80::1]:data"},
		// The URL form.
		{"rdmacp://host/data/dir/f", "host:7362 data/dir/f"},
		{"rdmacp://host:9000/data/a%20b", "host:9000 data/a b"},
		{"rdmacp://[::1]:99/data", "[::1]:99 data"},
		{"rdmacp://host", "host:7362 "},
		{"rdmacp://me@host/data", `error drop "me@"`},
		{"rdmacp://host:0/data", "error bad port"},
		{"rdmacp://host/data?x=1", "error a query"},
		{"rdmacp:///data", "error empty host"},
	} {
		r, ok, err := parseRemote(tc.in)
		got := "local"
		switch {
		case err != nil:
			got = "error " + err.Error()
		case ok:
			got = r.addr + " " + r.path
		}
		if !matches(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
}

// matches: got is want, or an error containing what follows "error ".
func matches(got, want string) bool {
	if w, ok := strings.CutPrefix(want, "error "); ok {
		return strings.HasPrefix(got, "error ") && strings.Contains(got, w)
	}
	return got == want
}

func TestParseListTarget(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"host", "host:7362 "},
		{"host:", "host:7362 "},
		{"host:7000", "host:7000 "},
		{"host:data/sub", "host:7362 data/sub"},
		{"[::1]", "[::1]:7362 "},
		{"root@host", `error "root@host:": drop "root@"`},
		{"./dir", "error not a remote path"},
	} {
		r, err := parseListTarget(tc.in)
		got := r.addr + " " + r.path
		if err != nil {
			got = "error " + err.Error()
		}
		if !matches(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNearest(t *testing.T) {
	t.Parallel()
	names := []string{"recursive", "qps", "quiet", "depth", "digest", "dry-run"}
	for in, want := range map[string]string{"recursiv": "recursive", "rec": "recursive", "qsp": "qps", "dpeth": "depth", "xyzzy": "", "dry": "dry-run"} {
		if got := nearest(in, names); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
