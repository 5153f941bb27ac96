package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/rdmacp/rdmacp/target"
)

// remote is a parsed HOST[:PORT]:EXPORT/PATH.
type remote struct {
	addr string // host:port
	path string // EXPORT/PATH, possibly empty
}

// parseRemote reads an operand as scp does, with rdmacp's port. The rules,
// in order (TestParseRemoteRules has one case for each):
//
//  1. No colon, or a slash before the first colon: a local path (ok=false).
//     "./a:b" and "dir/a:b" are local.
//  2. "[V6]" opens with a bracketed host, which must be followed by ":".
//  3. "USER@HOST:..." is refused: rdmacp has no remote users (the
//     target's secret decides access).
//  4. After HOST:, "DIGITS:REST" makes DIGITS the port and REST the path;
//     a bare "DIGITS" (nothing after) is the port too, with no path:
//     "host:7362" lists host's exports on port 7362. An export literally
//     named 7362 is "host:7362/" or "host:PORT:7362".
//  5. Otherwise the port is target.DefaultPort and the rest is the path,
//     its leading and trailing slashes trimmed.
//
// An operand that starts with rdmacp:// is a URL (parseURL). Habits from
// elsewhere get a hint instead of a puzzle: rsync's HOST::MODULE, an
// IPv6 address without its brackets.
func parseRemote(s string) (remote, bool, error) {
	if strings.HasPrefix(s, urlScheme) {
		r, err := parseURL(s)
		return r, err == nil, err
	}
	host, rest, ok, err := splitHost(s)
	if err != nil || !ok {
		return remote{}, ok, err
	}
	if err := noUser(s, host); err != nil {
		return remote{}, false, err
	}
	if hint := bareIPv6(s); hint != "" {
		return remote{}, false, fmt.Errorf("%q: an IPv6 address goes in brackets: %s", s, hint)
	}
	if host == "" {
		return remote{}, false, fmt.Errorf("%q: empty host: want HOST[:PORT]:EXPORT/PATH", s)
	}
	if strings.HasPrefix(rest, ":") {
		return remote{}, false, fmt.Errorf("%q: HOST::MODULE is rsync's daemon syntax; rdmacp's is HOST:EXPORT/PATH (%s:%s), or HOST:PORT:EXPORT/PATH", s, host, rest[1:])
	}
	port := target.DefaultPort
	p, tail, hasPort := strings.Cut(rest, ":")
	if hasPort && strings.Contains(p, "/") {
		hasPort = false // a colon inside the path: "host:data/a:b"
	}
	if !hasPort && allDigits(rest) {
		p, tail, hasPort = rest, "", true
	}
	if hasPort {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return remote{}, false, fmt.Errorf("%q: bad port %q: want 1..65535", s, p)
		}
		port, rest = n, tail
	}
	return remote{addr: net.JoinHostPort(host, strconv.Itoa(port)), path: strings.Trim(rest, "/")}, true, nil
}

// urlScheme starts the URL form of an operand, for scripts:
// rdmacp://HOST[:PORT]/EXPORT/PATH, with %XX escapes in the path.
const urlScheme = "rdmacp://"

func parseURL(s string) (remote, error) {
	u, err := url.Parse(s)
	if err != nil {
		return remote{}, fmt.Errorf("%q: %w", s, errors.Unwrap(err))
	}
	switch {
	case u.User != nil:
		return remote{}, fmt.Errorf("%q: drop %q: %w", s, u.User.String()+"@", errRemoteUser)
	case u.Hostname() == "":
		return remote{}, fmt.Errorf("%q: empty host: want rdmacp://HOST[:PORT]/EXPORT/PATH", s)
	case u.RawQuery != "" || u.Fragment != "":
		return remote{}, fmt.Errorf("%q: a query or fragment means nothing here: want rdmacp://HOST[:PORT]/EXPORT/PATH", s)
	}
	port := target.DefaultPort
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return remote{}, fmt.Errorf("%q: bad port %q: want 1..65535", s, p)
		}
		port = n
	}
	return remote{addr: net.JoinHostPort(u.Hostname(), strconv.Itoa(port)), path: strings.Trim(u.Path, "/")}, nil
}

// bareIPv6 is the bracketed spelling of s when s starts with an IPv6
// address without brackets ("::1:data/f", "fe80::1:data"), else "".
func bareIPv6(s string) string {
	if strings.HasPrefix(s, "[") {
		return ""
	}
	for i := len(s) - 1; i > 0; i-- {
		if s[i] != ':' {
			continue
		}
		if ip := net.ParseIP(s[:i]); ip != nil && strings.Contains(s[:i], ":") {
			return "[" + s[:i] + "]:" + s[i+1:]
		}
	}
	return ""
}

// errRemoteUser: an address named a user, which rdmacp has no use for.
var errRemoteUser = errors.New("rdmacp has no remote users; the target's secret decides access")

// noUser refuses "USER@" in host (rule 3); s is the whole operand.
func noUser(s, host string) error {
	if at := strings.LastIndex(host, "@"); at >= 0 {
		return fmt.Errorf("%q: drop %q: %w", s, host[:at+1], errRemoteUser)
	}
	return nil
}

// splitHost splits "HOST:REST" or "[V6]:REST" (rules 1 and 2).
func splitHost(s string) (host, rest string, ok bool, err error) {
	// A user part may come before a bracketed host: root@[::1]:x.
	user := ""
	if at := strings.Index(s, "@["); at >= 0 && !strings.ContainsAny(s[:at], "/:") {
		user, s = s[:at+1], s[at+1:]
	}
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return "", "", false, fmt.Errorf("%q: missing ]", user+s)
		}
		if !strings.HasPrefix(s[end+1:], ":") {
			return "", "", false, fmt.Errorf("%q: want [HOST]:EXPORT/PATH", user+s)
		}
		return user + s[1:end], s[end+2:], true, nil
	}
	i := strings.Index(s, ":")
	if i < 0 || strings.Contains(s[:i], "/") {
		return "", "", false, nil
	}
	return s[:i], s[i+1:], true, nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// parseListTarget reads ls's operand: a remote path, or a bare HOST
// (or [V6]) whose exports are listed.
func parseListTarget(s string) (remote, error) {
	bare := !strings.Contains(s, ":") && s != "" && !strings.ContainsAny(s, "/ ")
	if bare || strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s += ":"
	}
	r, ok, err := parseRemote(s)
	if err == nil && !ok {
		err = fmt.Errorf("%q is not a remote path: want HOST, HOST:PORT or HOST[:PORT]:[EXPORT[/DIR]]", s)
	}
	return r, err
}
