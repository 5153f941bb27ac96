package protocol

import (
	"errors"
	"strings"
	"testing"
)

// A message over a cap fails to decode with a CapError naming it; one at
// the cap decodes.
func TestDecodeCaps(t *testing.T) {
	entries := func(n int) []WalkEntry {
		es := make([]WalkEntry, n)
		for i := range es {
			es[i].Entry = Entry{Type: FileRegular, Name: "f"}
		}
		return es
	}
	files := func(n int) []PackedFile {
		fs := make([]PackedFile, n)
		for i := range fs {
			fs[i].Entry = Entry{Type: FileRegular, Name: "f"}
		}
		return fs
	}
	for _, c := range []struct {
		name string
		m    Message
		want string // "" for none
	}{
		{"name at the cap", &StatReply{Entry: Entry{Name: strings.Repeat("n", MaxName)}}, ""},
		{"name past the cap", &StatReply{Entry: Entry{Name: strings.Repeat("n", MaxName+1)}}, "name of 256 bytes, over the protocol's cap of 255 bytes"},
		{"target at the cap", &ListReply{Entries: []Entry{{Name: "l", Target: strings.Repeat("t", MaxPath)}}}, ""},
		{"target past the cap", &ListReply{Entries: []Entry{{Name: "l", Target: strings.Repeat("t", MaxPath+1)}}}, "symlink target of 4097 bytes"},
		{"walk batch at the cap", &WalkBatch{Entries: entries(MaxBatchEntries)}, ""},
		{"walk batch past the cap", &WalkBatch{Entries: entries(MaxBatchEntries + 1)}, "entries of 1025, over the protocol's cap of 1024"},
		{"pack reply at the cap", &PackReply{Files: files(MaxBatchEntries)}, ""},
		{"pack reply past the cap", &PackReply{Files: files(MaxBatchEntries + 1)}, "entries of 1025"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := Marshal(c.m)
			if err != nil {
				t.Fatal(err)
			}
			_, err = Unmarshal(b)
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *CapError
			if !errors.As(err, &ce) || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a CapError saying %q", err, c.want)
			}
		})
	}
}

// A Walk's rules are bounded and well-formed, or the Walk is refused.
func TestWalkRulesRefused(t *testing.T) {
	many := &Walk{RequestID: 1, Path: "d"}
	for range MaxRules + 1 {
		many.Rules = append(many.Rules, WalkRule{Pattern: "x"})
	}
	b, err := Marshal(many)
	if err != nil {
		t.Fatal(err)
	}
	var ce *CapError
	if _, err := Unmarshal(b); !errors.As(err, &ce) || ce.What != "rules" {
		t.Errorf("%d rules: %v, want a cap error", len(many.Rules), err)
	}
	b, _ = Marshal(&Walk{RequestID: 1, Path: "d", Rules: []WalkRule{{Pattern: "x"}}})
	b[len(b)-4] = 2 // the include byte: before the pattern's length and its byte
	if _, err := Unmarshal(b); !errors.Is(err, ErrMalformed) {
		t.Errorf("include byte 2: %v, want malformed", err)
	}
}
