package escape

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"plain name.txt", "plain name.txt"},
		{"héllo wörld 日本", "héllo wörld 日本"},
		{"a\nb", `a\#012b`},
		{"\x1b]0;owned\x07", `\#033]0;owned\#007`},
		{"\x1b[2J\x1b[1A", `\#033[2J\#033[1A`},
		{"tab\there\r", `tab\#011here\#015`},
		{"del\x7f", `del\#177`},
		{"nul\x00", `nul\#000`},
		{"c1\u0085\u009b", `c1\#302\#205\#302\#233`},
		{"bad\xff\xfe utf8", `bad\#377\#376 utf8`},
		{"cut\xe2\x80", `cut\#342\#200`},
		{"evil\u202egpj.exe", `evil\#342\#200\#256gpj.exe`},
		{"\u202a\u202b\u202c\u202d", `\#342\#200\#252\#342\#200\#253\#342\#200\#254\#342\#200\#255`},
		{"\u2066x\u2067y\u2068z\u2069", `\#342\#201\#246x\#342\#201\#247y\#342\#201\#250z\#342\#201\#251`},
		{"line\u2028sep", `line\#342\#200\#250sep`},
		{"zero\u200bwidth", `zero\#342\#200\#213width`},
		{`back\slash`, `back\slash`},
		{`looks\#033escaped`, `looks\#134#033escaped`},
		{`end\`, `end\`},
	} {
		if got := String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// unescape reads String's output back.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 < len(s) && s[i+1] == '#' {
			o := s[i+2 : i+5]
			b.WriteByte((o[0]-'0')<<6 | (o[1]-'0')<<3 | (o[2] - '0'))
			i += 4
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FuzzString: the result has no byte a terminal acts on, is valid UTF-8
// without invisible characters, and reads back to the input.
func FuzzString(f *testing.F) {
	for _, s := range []string{"a\nb", "\x1b[2J", "\u202e", "\xff", `\#`, `\\#1`, "ok"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := String(s)
		if !utf8.ValidString(e) {
			t.Fatalf("String(%q) = %q: invalid UTF-8", s, e)
		}
		for _, r := range e {
			if r < 0x20 || r == 0x7f || unsafeRune(r, utf8.RuneLen(r)) {
				t.Fatalf("String(%q) = %q: has %U", s, e, r)
			}
		}
		if back := unescape(e); back != s {
			t.Fatalf("String(%q) = %q reads back as %q", s, e, back)
		}
	})
}
