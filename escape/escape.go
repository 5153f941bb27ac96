// Package escape makes text that came from the network safe to print on a
// terminal. A target chooses the names it sends; printed raw, a name with
// ESC, BEL or a newline can retitle or clear the user's terminal, erase
// lines and print fake status lines, and one with a bidi override can make
// a name read as another. Every printer of names and of error messages
// that may hold them (ls, cp -v, the progress line, summaries, errors)
// calls String. JSON output does not: encoding/json escapes control
// characters itself and keeps the exact name (see README.md, "Names on
// the terminal").
package escape

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// String returns s with every byte that is not part of a printable
// character written as rsync writes it, \#ooo (a backslash, '#', and the
// byte in three octal digits): control characters (C0, DEL, C1), bytes of
// invalid UTF-8, and characters that are not printable by
// unicode.IsPrint, among them the bidi overrides and isolates (U+202A to
// U+202E, U+2066 to U+2069), zero-width characters and the line and
// paragraph separators. A backslash followed by '#' is written \#134, so
// that the result reads back to s unambiguously. The space is kept.
func String(s string) string {
	i := unsafeAt(s)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\\' && strings.HasPrefix(s[i+1:], "#"):
			octal(&b, '\\')
		case unsafeRune(r, n):
			for _, c := range []byte(s[i : i+n]) {
				octal(&b, c)
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// unsafeAt is the index of s's first byte that String changes, or -1.
func unsafeAt(s string) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && !(c == '\\' && strings.HasPrefix(s[i+1:], "#")) {
			i++ // the common case: printable ASCII
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == '\\' && n == 1) || unsafeRune(r, n) {
			return i
		}
		i += n
	}
	return -1
}

// unsafeRune: r, of n bytes, is invalid UTF-8 or not printable.
func unsafeRune(r rune, n int) bool {
	return (r == utf8.RuneError && n == 1) || (r != ' ' && !unicode.IsPrint(r))
}

func octal(b *strings.Builder, c byte) {
	b.WriteString(`\#`)
	b.WriteByte('0' + c>>6)
	b.WriteByte('0' + c>>3&7)
	b.WriteByte('0' + c&7)
}
