package main

import (
	"strings"
	"testing"
	"time"
)

// --modify-window's default is 0, so every spelling of 0 is taken, and
// a bad value is told what is wanted: "0s" once got "want seconds or a
// duration such as 500ms", and "-1" "want a positive duration".
func TestParseModifyWindow(t *testing.T) {
	for in, want := range map[string]time.Duration{"0": 0, "0.0": 0, "00": 0, "0s": 0, "": 0, "2": 2 * time.Second, "1.5": 1500 * time.Millisecond, "2s": 2 * time.Second} {
		if got, err := parseModifyWindow(in); err != nil || got != want {
			t.Errorf("parseModifyWindow(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-1", "-1s", "soon", "NaN", "1e30"} {
		if _, err := parseModifyWindow(in); err == nil || !strings.Contains(err.Error(), "want 0 or more seconds") {
			t.Errorf("parseModifyWindow(%q): %v; want \"want 0 or more seconds\"", in, err)
		}
	}
}
