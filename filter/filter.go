// Package filter is rsync's include and exclude rules, one matcher for both
// ends: the initiator filters what it copies and sends the rules with
// Walk, so that the target neither walks nor stats what they exclude.
package filter

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Filter is a list of include and exclude rules in rsync's syntax, the
// common subset of --include, --exclude and --exclude-from:
//
//   - Rules are tried in the order given; the first that matches decides.
//     A path no rule matches is included.
//   - "*" matches any run of characters but '/', "**" any run at all,
//     "?" one character but '/', "[...]" one of a class ("[!...]" or
//     "[^...]": one not in it), and "\" takes the next character as it is.
//   - A pattern starting with "/" is anchored at the transfer root (the
//     directory copied); otherwise it matches at the end of the path: a
//     pattern without "/" (or "**") matches the last component, one with
//     "/" the last components at a '/' boundary.
//   - A pattern ending with "/" matches directories only; "dir/***"
//     matches dir and everything in it.
//   - "+ PATTERN" and "- PATTERN" are an include and an exclude whatever
//     the option that gave them.
//
// An excluded directory is not copied, nor is anything in it: rules
// cannot include a file in an excluded directory. With --delete,
// excluded destination entries are kept, as rsync keeps them.
// The zero Filter includes everything.
type Filter struct {
	rules []rule
}

type rule struct {
	include  bool
	text     string // as given, for messages
	pats     []string
	anchored bool
	dirOnly  bool
	whole    bool // has '/' or "**": matched against the path, else its last component
}

// Add adds a rule: an include if include, else an exclude, unless the
// pattern starts with "+ " or "- ".
func (f *Filter) Add(pattern string, include bool) error {
	p := pattern
	switch {
	case strings.HasPrefix(p, "+ "):
		include, p = true, p[2:]
	case strings.HasPrefix(p, "- "):
		include, p = false, p[2:]
	}
	if p == "" || p == "/" {
		return fmt.Errorf("filter rule %q: empty pattern", pattern)
	}
	r := rule{include: include, text: pattern}
	if strings.HasSuffix(p, "/***") {
		p = p[:len(p)-4]
		r.pats = []string{p, p + "/**"}
		r.whole = true
	} else {
		if strings.HasSuffix(p, "/") {
			r.dirOnly, p = true, strings.TrimRight(p, "/")
		}
		r.pats = []string{p}
	}
	if strings.HasPrefix(p, "/") {
		r.anchored = true
		for i := range r.pats {
			r.pats[i] = strings.TrimPrefix(r.pats[i], "/")
		}
	}
	if p == "" {
		return fmt.Errorf("filter rule %q: empty pattern", pattern)
	}
	r.whole = r.whole || strings.Contains(strings.TrimPrefix(p, "/"), "/") || strings.Contains(p, "**")
	f.rules = append(f.rules, r)
	return nil
}

// AddFrom adds the rules of a file as rsync's --exclude-from (include:
// --include-from) reads them: one pattern a line; blank lines and lines
// starting with ';' or '#' are skipped.
func (f *Filter) AddFrom(r io.Reader, include bool) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(l) == "" || l[0] == ';' || l[0] == '#' {
			continue
		}
		if err := f.Add(l, include); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
	}
	return sc.Err()
}

// Empty reports whether f has no rules.
func (f *Filter) Empty() bool { return f == nil || len(f.rules) == 0 }

// Excluded reports whether rel ('/'-separated, relative to the transfer
// root) is excluded by itself; the caller also excludes whatever is in an
// excluded directory.
func (f *Filter) Excluded(rel string, dir bool) bool {
	if f == nil {
		return false
	}
	for _, r := range f.rules {
		if r.matches(rel, dir) {
			return !r.include
		}
	}
	return false
}

func (r *rule) matches(rel string, dir bool) bool {
	if r.dirOnly && !dir {
		return false
	}
	for _, p := range r.pats {
		switch {
		case r.anchored:
			if glob(p, rel) {
				return true
			}
		case !r.whole:
			if glob(p, rel[strings.LastIndexByte(rel, '/')+1:]) {
				return true
			}
		default: // at every '/' boundary, from the whole path down
			for i := 0; i < len(rel); i++ {
				if (i == 0 || rel[i-1] == '/') && glob(p, rel[i:]) {
					return true
				}
			}
		}
	}
	return false
}

// glob matches name against pattern p: see Filter for the syntax.
func glob(p, name string) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			if strings.HasPrefix(p, "**") {
				rest := strings.TrimLeft(p, "*")
				for i := 0; i <= len(name); i++ {
					if glob(rest, name[i:]) {
						return true
					}
				}
				return false
			}
			rest := p[1:]
			for i := 0; i <= len(name); i++ {
				if glob(rest, name[i:]) {
					return true
				}
				if i < len(name) && name[i] == '/' {
					return false
				}
			}
			return false
		case '?':
			if name == "" || name[0] == '/' {
				return false
			}
			p, name = p[1:], name[1:]
		case '[':
			if name == "" || name[0] == '/' {
				return false
			}
			ok, n := class(p, name[0])
			if n == 0 { // no closing ']': a plain '['
				if name[0] != '[' {
					return false
				}
				n = 1
			} else if !ok {
				return false
			}
			p, name = p[n:], name[1:]
		case '\\':
			if len(p) > 1 {
				p = p[1:]
			}
			fallthrough
		default:
			if name == "" || name[0] != p[0] {
				return false
			}
			p, name = p[1:], name[1:]
		}
	}
	return name == ""
}

// class matches c against the class at the start of p ("[...]"),
// returning whether it matched and the class's length (0 if unclosed).
func class(p string, c byte) (bool, int) {
	i := 1
	neg := i < len(p) && (p[i] == '!' || p[i] == '^')
	if neg {
		i++
	}
	match := false
	for first := true; i < len(p); first = false {
		if p[i] == ']' && !first {
			return match != neg, i + 1
		}
		lo := p[i]
		if lo == '\\' && i+1 < len(p) {
			i++
			lo = p[i]
		}
		i++
		hi := lo
		if i+1 < len(p) && p[i] == '-' && p[i+1] != ']' {
			hi = p[i+1]
			if hi == '\\' && i+2 < len(p) {
				i++
				hi = p[i+1]
			}
			i += 2
		}
		if lo <= c && c <= hi {
			match = true
		}
	}
	return false, 0
}

// Rule is one rule as it travels: an include or an exclude, and its
// pattern as the user gave it ("+ " and "- " prefixes still decide).
type Rule struct {
	Include bool
	Pattern string
}

// Rules are f's rules, in order, for the wire.
func (f *Filter) Rules() []Rule {
	if f == nil {
		return nil
	}
	out := make([]Rule, len(f.rules))
	for i, r := range f.rules {
		out[i] = Rule{Include: r.include, Pattern: r.text}
	}
	return out
}

// FromRules is the Filter of rules from the wire; nil for none.
func FromRules(rules []Rule) (*Filter, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	f := &Filter{}
	for _, r := range rules {
		if err := f.Add(r.Pattern, r.Include); err != nil {
			return nil, err
		}
	}
	return f, nil
}
