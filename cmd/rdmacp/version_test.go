package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionText(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/rdmacp/rdmacp", Version: "v0.1.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-12-03T00:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	got := versionText("0.1.0-dev", bi, true)
	for _, want := range []string{"0.1.0-dev", "github.com/rdmacp/rdmacp v0.1.0", "revision 0123abcd 2026-12-03T00:00:00Z, modified", "go1.26.8"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	bi.Settings = nil
	if got := versionText("x", bi, true); !strings.Contains(got, "no VCS revision") {
		t.Errorf("%q: a build without VCS stamps must say so", got)
	}
	if got := versionText("x", nil, false); got != "x (no build information)" {
		t.Errorf("%q", got)
	}
}
