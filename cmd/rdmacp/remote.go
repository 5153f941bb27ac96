package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/rdmacp/rdmacp/target"
)

// remote is a parsed HOST[:PORT]:EXPORT/PATH.
type remote struct {
	addr string // host:port
	path string // EXPORT/PATH, possibly empty
}

// parseRemote reads HOST[:PORT]:PATH, with [v6] hosts in brackets. It
// reports ok=false for a local path (no colon before the first slash).
func parseRemote(s string) (remote, bool, error) {
	var host, rest string
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return remote{}, false, fmt.Errorf("%q: missing ]", s)
		}
		host, rest = s[1:end], s[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return remote{}, false, fmt.Errorf("%q: want [HOST]:EXPORT/PATH", s)
		}
		rest = rest[1:]
	} else {
		i := strings.Index(s, ":")
		if i < 0 || (strings.Contains(s[:i], "/")) {
			return remote{}, false, nil
		}
		host, rest = s[:i], s[i+1:]
	}
	if host == "" {
		return remote{}, false, fmt.Errorf("%q: empty host", s)
	}
	port := target.DefaultPort
	if i := strings.Index(rest, ":"); i >= 0 && !strings.Contains(rest[:i], "/") {
		p, err := strconv.Atoi(rest[:i])
		if err != nil || p < 1 || p > 65535 {
			return remote{}, false, fmt.Errorf("%q: bad port %q", s, rest[:i])
		}
		port, rest = p, rest[i+1:]
	}
	return remote{addr: net.JoinHostPort(host, strconv.Itoa(port)), path: strings.Trim(rest, "/")}, true, nil
}
