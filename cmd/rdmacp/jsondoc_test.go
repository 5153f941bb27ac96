package main

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator/tree"
)

// A script reading cp --json's file lines switches on "status": the
// guide's list of its values must hold every one cp writes. It once
// named four of the eight ("unchanged", the most common on a second
// run, was missing).
func TestGuideListsFileStatuses(t *testing.T) {
	b, err := os.ReadFile("../../docs/guide.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)`status` is (.*?); the summary").FindSubmatch(b)
	if m == nil {
		t.Fatal("docs/guide.md has no \"`status` is ...; the summary\" sentence")
	}
	list := string(m[1])
	for _, st := range []string{tree.StatusOK, tree.StatusFailed, tree.StatusSkipped, tree.StatusSame,
		tree.StatusUnchanged, tree.StatusDeleted, tree.StatusWouldCopy, tree.StatusWouldDelete} {
		if !strings.Contains(list, "`"+st+"`") {
			t.Errorf("docs/guide.md's list of file statuses lacks `%s`: %q", st, list)
		}
	}
}
