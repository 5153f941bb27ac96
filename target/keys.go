package target

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"

	"github.com/rdmacp/rdmacp/protocol"
	"github.com/rdmacp/rdmacp/reads"
)

// A Right is what a client may do with an export. Each includes the
// ones before it: push includes read (a push lists and stats its
// destination too).
type Right uint8

const (
	RightNone Right = iota
	RightRead       // Open, Stat, List, Walk, Pack
	RightPush       // Push too, into an export served writable
)

func (r Right) String() string {
	switch r {
	case RightRead:
		return "read"
	case RightPush:
		return "push"
	}
	return "none"
}

// anyExport names, in a keys file, every export not named on its own.
const anyExport = "*"

// A Client is one identity of a keys file: its name, its key (the text
// of the client's --secret-file) and its rights per export.
type Client struct {
	Name   string
	Key    []byte
	Rights map[string]Right // by export name; anyExport for the rest
	// BwLimit caps each of the client's sessions, bytes per second (a
	// "bwlimit NAME RATE" line); 0: only serve's --bwlimit.
	BwLimit int64
	line    int
}

// right is c's right on export name, before address rules.
func (c *Client) right(name string) Right {
	if r, ok := c.Rights[name]; ok {
		return r
	}
	return c.Rights[anyExport]
}

// Keys are the clients a target knows and the addresses each export
// takes. A target authenticates a client by its name's key and nothing
// else: an unknown name is checked against a random key of the Keys'
// own, so that it fails as a wrong key does, with the same work.
type Keys struct {
	clients map[string]*Client
	hosts   map[string][]netip.Prefix // by export name, anyExport for the rest; absent: any address
	dummy   []byte
}

// MinKeyLen is the shortest key a keys file takes, in bytes: a key is a
// secret shared by two machines, not a password a person types.
const MinKeyLen = 16

// SingleKey is the Keys of a target with one shared secret: identity
// "default" with every right (push where the export is writable).
func SingleKey(secret []byte) *Keys {
	k := newKeys()
	k.clients[protocol.DefaultIdentity] = &Client{Name: protocol.DefaultIdentity, Key: secret, Rights: map[string]Right{anyExport: RightPush}}
	return k
}

func newKeys() *Keys {
	k := &Keys{clients: map[string]*Client{}, hosts: map[string][]netip.Prefix{}, dummy: make([]byte, 32)}
	rand.Read(k.dummy)
	return k
}

// Names lists the clients, sorted.
func (k *Keys) Names() []string {
	out := make([]string, 0, len(k.clients))
	for n := range k.clients {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// lookup is name's client and key, or nil and the dummy key: the caller
// checks a MAC either way.
func (k *Keys) lookup(name string) (*Client, []byte) {
	if c := k.clients[name]; c != nil {
		return c, c.Key
	}
	return nil, k.dummy
}

// allows reports whether export name takes connections from ip.
func (k *Keys) allows(name string, ip netip.Addr) bool {
	ps, ok := k.hosts[name]
	if !ok {
		if ps, ok = k.hosts[anyExport]; !ok {
			return true
		}
	}
	for _, p := range ps {
		if ip.IsValid() && p.Contains(ip.Unmap()) {
			return true
		}
	}
	return false
}

// level is what client c may do with export name from ip.
func (k *Keys) level(c *Client, name string, ip netip.Addr) Right {
	if c == nil || !k.allows(name, ip) {
		return RightNone
	}
	return c.right(name)
}

// A KeysError is a mistake in a keys file, at a line.
type KeysError struct {
	File string
	Line int
	Err  string
}

func (e *KeysError) Error() string { return fmt.Sprintf("keys file %s:%d: %s", e.File, e.Line, e.Err) }

// LoadKeys reads a keys file.
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("keys file: %w", err)
	}
	defer f.Close()
	return ParseKeys(f, path)
}

// ParseKeys reads a keys file from r; file names it in errors. The
// format, one statement a line, '#' to the end of a line a comment:
//
//	client NAME KEY [EXPORT=RIGHT ...]
//	hosts EXPORT ADDRESS-OR-CIDR ...
//	bwlimit NAME RATE
//
// RIGHT is read, push or none; EXPORT "*" is every export not named on
// its own. A client without a right for an export has none there. An
// export with a hosts line is used only from those addresses (by anyone,
// whatever their rights); "hosts *" covers the exports without a line.
// A bwlimit line caps each session of client NAME (named on an earlier
// line) at RATE, in --bwlimit's units, below serve's own cap if lower.
func ParseKeys(r io.Reader, file string) (*Keys, error) {
	k := newKeys()
	hostLine := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		n++
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		fail := func(format string, args ...any) (*Keys, error) {
			return nil, &KeysError{File: file, Line: n, Err: fmt.Sprintf(format, args...)}
		}
		switch f[0] {
		case "client":
			if len(f) < 3 {
				return fail("want client NAME KEY [EXPORT=RIGHT ...]")
			}
			c, msg := parseClient(f[1], f[2], f[3:])
			if msg != "" {
				return fail("%s", msg)
			}
			if old := k.clients[c.Name]; old != nil {
				return fail("client %q given twice (first on line %d)", c.Name, old.line)
			}
			for _, o := range k.clients {
				if bytes.Equal(o.Key, c.Key) {
					return fail("client %q has the same key as client %q (line %d): give each client its own", c.Name, o.Name, o.line)
				}
			}
			c.line = n
			k.clients[c.Name] = c
		case "bwlimit":
			if msg := parseBwLimit(k, f[1:]); msg != "" {
				return fail("%s", msg)
			}
		case "hosts":
			if len(f) < 3 {
				return fail("want hosts EXPORT ADDRESS-OR-CIDR ...")
			}
			name := f[1]
			if name != anyExport && !validName(name) {
				return fail("export name %q: use letters, digits, '.', '_' and '-', or *", name)
			}
			if first, ok := hostLine[name]; ok {
				return fail("hosts for export %q given twice (first on line %d): list every address on one line", name, first)
			}
			for _, a := range f[2:] {
				p, err := parseHost(a)
				if err != nil {
					return fail("hosts %s: %q is neither an address nor a CIDR (as 10.0.0.0/8 or fd00::/8)", name, a)
				}
				k.hosts[name] = append(k.hosts[name], p)
			}
			hostLine[name] = n
		default:
			return fail("unknown statement %q: want client or hosts", f[0])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, &KeysError{File: file, Line: n + 1, Err: err.Error()}
	}
	if len(k.clients) == 0 {
		return nil, &KeysError{File: file, Line: n, Err: "no clients: add a line client NAME KEY EXPORT=RIGHT"}
	}
	return k, nil
}

// placeholder reports whether key is one written <LIKE-THIS>, as the
// sample keys file (contrib/keys.sample) and the README write them: a
// sample copied as it is must not serve with keys anyone can read.
func placeholder(key string) bool {
	return strings.HasPrefix(key, "<") && strings.HasSuffix(key, ">")
}

// parseClient reads one client line's fields, or says what is wrong.
func parseClient(name, key string, rights []string) (*Client, string) {
	if !protocol.ValidIdentity(name) {
		return nil, fmt.Sprintf("client name %q: use 1 to %d letters, digits, '.', '_', '-' or '@'", name, protocol.MaxIdentity)
	}
	if placeholder(key) {
		return nil, fmt.Sprintf("client %q: key %s is a placeholder: put a key of the client's own there (make one with: openssl rand -base64 32)", name, key)
	}
	if len(key) < MinKeyLen {
		return nil, fmt.Sprintf("client %q: key of %d bytes is shorter than %d (make one with: openssl rand -base64 32)", name, len(key), MinKeyLen)
	}
	c := &Client{Name: name, Key: []byte(key), Rights: map[string]Right{}}
	for _, r := range rights {
		exp, right, ok := strings.Cut(r, "=")
		if !ok {
			return nil, fmt.Sprintf("client %q: %q: want EXPORT=RIGHT (as home=read)", name, r)
		}
		if exp != anyExport && !validName(exp) {
			return nil, fmt.Sprintf("client %q: export name %q: use letters, digits, '.', '_' and '-', or *", name, exp)
		}
		if _, dup := c.Rights[exp]; dup {
			return nil, fmt.Sprintf("client %q: export %q given twice", name, exp)
		}
		switch right {
		case "read":
			c.Rights[exp] = RightRead
		case "push":
			c.Rights[exp] = RightPush
		case "none":
			c.Rights[exp] = RightNone
		default:
			return nil, fmt.Sprintf("client %q: right %q for export %q: want read, push or none", name, right, exp)
		}
	}
	return c, ""
}

// parseBwLimit reads a bwlimit line's NAME RATE into its client.
func parseBwLimit(k *Keys, f []string) string {
	if len(f) != 2 {
		return "want bwlimit NAME RATE (as bwlimit backup 50M)"
	}
	c := k.clients[f[0]]
	if c == nil {
		return fmt.Sprintf("bwlimit for client %q: no client line names it before this one", f[0])
	}
	if c.BwLimit != 0 {
		return fmt.Sprintf("bwlimit for client %q given twice", f[0])
	}
	r, err := reads.ParseRate(f[1])
	if err != nil {
		return fmt.Sprintf("bwlimit for client %q: %v", f[0], err)
	}
	c.BwLimit = r
	return ""
}

// parseHost reads an address (a /32 or /128) or a CIDR.
func parseHost(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// peerAddr is the IP address of a "host:port" (or bare host) string;
// the zero Addr, which no hosts rule matches, if it has none.
func peerAddr(addr string) netip.Addr {
	a, err := netip.ParseAddr(peerIP(addr))
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}
