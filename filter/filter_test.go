package filter

import (
	"strings"
	"testing"
)

// The cases follow rsync(1)'s "INCLUDE/EXCLUDE PATTERN RULES" and its
// examples; the ones marked "rsync" were checked against rsync 3.2.
func TestFilterRules(t *testing.T) {
	type rl struct {
		pat     string
		include bool
	}
	ex := func(p string) rl { return rl{p, false} }
	in := func(p string) rl { return rl{p, true} }
	cases := []struct {
		rules    []rl
		rel      string
		dir      bool
		excluded bool
	}{
		// A pattern without '/' matches the last component, anywhere.
		{[]rl{ex("*.o")}, "a.o", false, true},
		{[]rl{ex("*.o")}, "sub/deep/a.o", false, true},
		{[]rl{ex("*.o")}, "a.c", false, false},
		{[]rl{ex("foo")}, "x/foo", true, true},
		{[]rl{ex("foo")}, "x/foobar", false, false},
		// '*' stops at '/', '**' does not.
		{[]rl{ex("/*.o")}, "sub/a.o", false, false},
		{[]rl{ex("/**.o")}, "sub/a.o", false, true},
		{[]rl{ex("sub/*")}, "sub/a/b", false, false},
		{[]rl{ex("sub/**")}, "sub/a/b", false, true},
		// A leading '/' anchors at the transfer root.
		{[]rl{ex("/foo")}, "foo", false, true},
		{[]rl{ex("/foo")}, "x/foo", false, false},
		// A '/' inside matches the last components at a boundary.
		{[]rl{ex("a/b")}, "x/a/b", false, true},
		{[]rl{ex("a/b")}, "xa/b", false, false},
		{[]rl{ex("a/*/c")}, "z/a/b/c", false, true},
		// A trailing '/' matches directories only.
		{[]rl{ex("cache/")}, "cache", true, true},
		{[]rl{ex("cache/")}, "cache", false, false},
		{[]rl{ex("cache/")}, "x/cache", true, true},
		// dir/*** is dir and all in it.
		{[]rl{ex("dir/***")}, "dir", true, true},
		{[]rl{ex("dir/***")}, "dir/a/b", false, true},
		{[]rl{ex("dir/***")}, "dirt", false, false},
		// '?' and classes.
		{[]rl{ex("file?.txt")}, "file1.txt", false, true},
		{[]rl{ex("file?.txt")}, "file10.txt", false, false},
		{[]rl{ex("[ab]*")}, "beta", false, true},
		{[]rl{ex("[!ab]*")}, "beta", false, false},
		{[]rl{ex("[a-c]x")}, "cx", false, true},
		{[]rl{ex("[a-c]x")}, "dx", false, false},
		{[]rl{ex(`\*`)}, "*", false, true},
		{[]rl{ex(`\*`)}, "a", false, false},
		// The first match wins (rsync: + *.c then - * keeps only .c files).
		{[]rl{in("*.c"), ex("*")}, "main.c", false, false},
		{[]rl{in("*.c"), ex("*")}, "main.h", false, true},
		{[]rl{ex("*"), in("*.c")}, "main.c", false, true},
		{[]rl{in("*/"), in("*.c"), ex("*")}, "src", true, false},
		// "+ " and "- " prefixes override the option.
		{[]rl{ex("+ keep.o"), ex("*.o")}, "keep.o", false, false},
		{[]rl{in("- *.tmp")}, "a.tmp", false, true},
		// Nothing matches: included.
		{nil, "a", false, false},
	}
	for _, tc := range cases {
		var f Filter
		var desc []string
		for _, r := range tc.rules {
			if err := f.Add(r.pat, r.include); err != nil {
				t.Fatal(err)
			}
			desc = append(desc, map[bool]string{true: "+", false: "-"}[r.include]+r.pat)
		}
		if got := f.Excluded(tc.rel, tc.dir); got != tc.excluded {
			t.Errorf("%v: Excluded(%q, dir %v) = %v, want %v", desc, tc.rel, tc.dir, got, tc.excluded)
		}
	}
}

func TestFilterAddFrom(t *testing.T) {
	var f Filter
	err := f.AddFrom(strings.NewReader("# comment\n; also\n\n*.log\n+ important.tmp\n*.tmp\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]bool{"a.log": true, "important.tmp": false, "x.tmp": true, "a.txt": false} {
		if got := f.Excluded(rel, false); got != want {
			t.Errorf("Excluded(%q) = %v, want %v", rel, got, want)
		}
	}
	if err := f.Add("/", false); err == nil {
		t.Error("an empty pattern was accepted")
	}
}

// Rules round trip: the target's Filter from the initiator's rules
// decides every path the same way.
func TestRulesRoundTrip(t *testing.T) {
	var f Filter
	for _, r := range []struct {
		p  string
		in bool
	}{{"+ keep/", false}, {"node_modules/", false}, {"*.o", false}, {"/top/***", false}, {"- x?z", true}} {
		if err := f.Add(r.p, r.in); err != nil {
			t.Fatal(err)
		}
	}
	g, err := FromRules(f.Rules())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rel string
		dir bool
	}{{"a/node_modules", true}, {"a/node_modules", false}, {"keep", true}, {"b.o", false}, {"top/q", false}, {"top", true}, {"xyz", false}, {"s/xaz", false}, {"fine.c", false}} {
		if f.Excluded(c.rel, c.dir) != g.Excluded(c.rel, c.dir) {
			t.Errorf("%q (dir %v): %v before the wire, %v after", c.rel, c.dir, f.Excluded(c.rel, c.dir), g.Excluded(c.rel, c.dir))
		}
	}
	if g, err := FromRules(nil); g != nil || err != nil || !g.Empty() {
		t.Errorf("no rules: %v, %v", g, err)
	}
}
