package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// What --help (and so the man page) sends a user to read must be there:
// the README is a short front page with no filter rules, keys file or
// config format, yet --exclude, --keys and --config once said "see
// README". A "see docs/guide.md, SECTION" must name one of its headings.
func TestHelpPointsWhereDocsAre(t *testing.T) {
	guide, err := os.ReadFile("../../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(guide), "\n") {
		if h, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " "); ok && strings.HasPrefix(line, "#") {
			headings[strings.ReplaceAll(h, "`", "")] = true
		}
	}
	seeGuide := regexp.MustCompile(`see docs/guide\.md, ([^;)]*?)(?:,? and |[;)]|$)`)
	for _, cmd := range newApp().Commands {
		texts := []string{cmd.Usage, cmd.Description}
		for _, f := range cmd.Flags {
			if d, ok := f.(cli.DocGenerationFlag); ok {
				texts = append(texts, d.GetUsage())
			}
		}
		for _, s := range texts {
			if strings.Contains(s, "README") {
				t.Errorf("%s: %q sends the user to the README, which does not hold it", cmd.Name, s)
			}
			for _, m := range seeGuide.FindAllStringSubmatch(s, -1) {
				if !hasHeading(headings, m[1]) {
					t.Errorf("%s: %q: docs/guide.md has no heading %q", cmd.Name, s, m[1])
				}
			}
		}
	}
}

// hasHeading is true when a heading is name or starts with it ("rdmacp
// serve" for "rdmacp serve").
func hasHeading(headings map[string]bool, name string) bool {
	for h := range headings {
		if h == name || strings.HasPrefix(h, name+" ") {
			return true
		}
	}
	return false
}
