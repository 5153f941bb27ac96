package leftover

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestTempNameCarriesPidAndHost(t *testing.T) {
	n := Name("data.bin")
	m := nameRE.FindStringSubmatch(n)
	if m == nil || m[1] != "data.bin" || m[2] != strconv.Itoa(os.Getpid()) || m[3] != hostTag() {
		t.Fatalf("temporary name %q: %q", n, m)
	}
	if long := Name(strings.Repeat("x", 255)); len(long) > 255 || !nameRE.MatchString(long) {
		t.Fatalf("long name %d bytes: %q", len(long), long)
	}
	if Name("a") == Name("a") {
		t.Fatal("two temporary names of one run are the same")
	}
}

// The liveness check: a name of a dead process of this host is a
// leftover; one of a live process (this one, or another), of another
// host, or of an older rdmacp (no pid) is not.
func TestLeftoverLiveness(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip(err)
	}
	live := exec.Command("sleep", "30")
	if err := live.Start(); err != nil {
		t.Skip(err)
	}
	defer live.Process.Kill()
	name := func(pid int, host string) string {
		return ".f.rdmacp-" + strconv.Itoa(pid) + "-" + host + "-00000000.part"
	}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{name(dead.Process.Pid, hostTag()), true},
		{name(live.Process.Pid, hostTag()), false},
		{name(os.Getpid(), hostTag()), false},
		{name(1, hostTag()), false}, // init: alive, and not ours to judge
		{name(dead.Process.Pid, "0000beef"), false},
		{".f.rdmacp-0abc84dac5da.part", false}, // an older run's: no pid
		{"f", false},
	} {
		if got := Dead(tc.name); got != tc.want {
			t.Errorf("Dead(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCleanLeftovers(t *testing.T) {
	defer func(a func(int) bool) { alive = a }(alive)
	alive = func(pid int) bool { return pid != 999999 }
	dir := t.TempDir()
	host := hostTag()
	for _, n := range []string{
		".a.rdmacp-999999-" + host + "-00000001.part", // dead: goes
		".b.rdmacp-999999-" + host + "-00000002.part", // dead, another name
		".a.rdmacp-123-" + host + "-00000003.part",    // alive: stays
		"a",
	} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	// A staged tree of a dead run, with a read-only directory in it.
	stage := filepath.Join(dir, ".a.rdmacp-999999-"+host+"-00000004.part")
	os.MkdirAll(filepath.Join(stage, "ro", "x"), 0o755)
	os.Chmod(filepath.Join(stage, "ro"), 0o500)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	gone := Clean(root, ".")
	for i := range gone {
		gone[i] = filepath.Join(dir, gone[i])
	}
	slices.Sort(gone)
	want := []string{filepath.Join(dir, ".a.rdmacp-999999-"+host+"-00000001.part"), stage, filepath.Join(dir, ".b.rdmacp-999999-"+host+"-00000002.part")}
	slices.Sort(want)
	if !slices.Equal(gone, want) {
		t.Fatalf("removed %v, want %v (a dead run's leftovers, whatever their name)", gone, want)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 2 {
		t.Fatalf("left %v, want the live run's and a", left)
	}
}
