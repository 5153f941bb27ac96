package main

import (
	"runtime/debug"
	"strings"
)

// versionText is what --version prints: the release, then the module
// version and the VCS revision the binary was built from, so a bug
// report names the exact build. (go build stamps vcs.* from a git
// checkout; go run and test binaries have none, and say so.)
func versionText(release string, bi *debug.BuildInfo, ok bool) string {
	if !ok {
		return release + " (no build information)"
	}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = ", modified"
			}
		}
	}
	parts := []string{"module " + bi.Main.Path + " " + bi.Main.Version}
	if rev != "" {
		parts = append(parts, "revision "+rev+" "+at+dirty)
	} else {
		parts = append(parts, "no VCS revision")
	}
	parts = append(parts, bi.GoVersion)
	return release + " (" + strings.Join(parts, ", ") + ")"
}

func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	return versionText(version, bi, ok)
}
