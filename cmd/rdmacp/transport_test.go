package main

import (
	"bytes"
	"encoding/json"
	"os"
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

// TestRoceSoftExplicit: --transport roce-soft pulls a file byte-exact
// and says so on the transport line; auto never picks it.
func TestRoceSoftExplicit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	want := writeFile(t, filepath.Join(dir, "f"), 3<<20+7)
	s := serve(t, dir, nil, "--transport", "roce-soft", "--roce-port", "0")
	dst := filepath.Join(t.TempDir(), "f")
	_, errs, code := run(t, "cp", "--transport", "roce-soft", "--roce-port", "0", s.addr+":data/f", dst)
	if code != 0 {
		t.Fatalf("cp over roce-soft: exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "transport: roce-soft (asked for with --transport)") {
		t.Errorf("transport line: %q", errs)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("roce-soft copy differs (%d of %d bytes, %v)", len(got), len(want), err)
	}
	// auto goes to iwarp-soft, which a roce-soft target does not speak:
	// an error, never a silent switch to roce-soft.
	_, errs, code = run(t, "cp", "--contimeout", "2s", s.addr+":data/f", filepath.Join(t.TempDir(), "g"))
	if code == 0 || strings.Contains(errs, "transport: roce-soft") {
		t.Errorf("auto against a roce-soft target: exit %d, %q", code, errs)
	}
}

// TestRoceICRC: --roce-icrc raw (the check a kernel rxe peer needs)
// pulls byte-exact over the raw receive path and says so on the
// transport line; an unknown mode is a usage error.
func TestRoceICRC(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: --roce-icrc raw needs CAP_NET_RAW (run as root)")
	}
	dir := t.TempDir()
	want := writeFile(t, filepath.Join(dir, "f"), 1<<20+3)
	s := serve(t, dir, nil, "--transport", "roce-soft", "--roce-port", "0", "--roce-icrc", "raw")
	dst := filepath.Join(t.TempDir(), "f")
	out, errs, code := run(t, "cp", "--json", "--transport", "roce-soft", "--roce-port", "0", "--roce-icrc", "raw", s.addr+":data/f", dst)
	if code != 0 {
		t.Fatalf("cp --roce-icrc raw: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum struct{ Transport string }
	json.Unmarshal([]byte(lines[len(lines)-1]), &sum)
	if !strings.Contains(sum.Transport, "icrc=raw") {
		t.Errorf("transport %q, want icrc=raw", sum.Transport)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("copy differs (%d of %d bytes, %v)", len(got), len(want), err)
	}
	if _, _, code := run(t, "cp", "--transport", "roce-soft", "--roce-icrc", "maybe", "h:x/y", t.TempDir()); code != exitUsage {
		t.Errorf("--roce-icrc maybe: exit %d", code)
	}
}

// TestIBVerbsSetupFlag: an --ibverbs-setup that names no setup is a
// usage error, before any device is opened.
func TestIBVerbsSetupFlag(t *testing.T) {
	if _, errs, code := run(t, "cp", "--transport", "ibverbs", "--ibverbs-setup", "cm", "h:x/y", t.TempDir()); code != exitUsage || !strings.Contains(errs, "--ibverbs-setup") {
		t.Errorf("--ibverbs-setup cm: exit %d: %s", code, errs)
	}
}
