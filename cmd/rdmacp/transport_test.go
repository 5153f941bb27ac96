package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestMPACRCNegotiation(t *testing.T) {
	t.Parallel()
	// CRC is used when either side asks for it (RFC 5044): off only
	// when neither does. The whole matrix, auto included, is
	// verbs/iwarp's TestCRCPolicy, in-process; here each side's flag
	// reaches its transport.
	for _, tc := range []struct {
		serve, cp, want string
	}{
		{"on", "off", "crc32c on"},
		{"off", "on", "crc32c on"},
		{"off", "off", "crc32c off"},
	} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "f"), 100<<10)
		s := serve(t, dir, nil, "--mpa-crc", tc.serve)
		out, errs, code := run(t, "cp", "--json", "--mpa-crc", tc.cp, s.addr+":data/f", filepath.Join(t.TempDir(), "f"))
		if code != 0 {
			t.Fatalf("serve %s, cp %s: exit %d: %s", tc.serve, tc.cp, code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var sum struct{ Transport string }
		json.Unmarshal([]byte(lines[len(lines)-1]), &sum)
		if !strings.Contains(sum.Transport, tc.want) {
			t.Errorf("serve %s, cp %s: transport %q, want %q", tc.serve, tc.cp, sum.Transport, tc.want)
		}
	}
	if _, _, code := run(t, "cp", "--mpa-crc", "maybe", "h:x/y", t.TempDir()); code != exitUsage {
		t.Errorf("--mpa-crc maybe: exit %d", code)
	}
}
