// Package leftover names temporary files so that a later run can tell
// the leftovers of a killed run from the files of one still going, and
// removes the leftovers. The initiator's temporary files and staged trees
// and the target's pushed files use it alike:
//
//	.NAME.rdmacp-PID-HOST-RAND.part
//
// PID is the process that writes it, HOST a hash of where that pid means
// something: the host's name, its boot and its pid namespace (a
// destination shared over NFS is written from several hosts, and one
// volume from several containers, whose pids mean nothing here), and RAND
// keeps two names of one run apart.
package leftover

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

var nameRE = regexp.MustCompile(`^\.(.+)\.rdmacp-([0-9]+)-([0-9a-f]{8})-([0-9a-f]{8})\.part$`)

// hostTag is this host's part of temporary names.
var hostTag = sync.OnceValue(func() string {
	h := fnv.New32a()
	name, _ := os.Hostname()
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	pidns, _ := os.Readlink("/proc/self/ns/pid")
	for _, part := range []string{name, string(boot), pidns} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return fmt.Sprintf("%08x", h.Sum32())
})

// Name is a new temporary name for a file named base, in its directory.
func Name(base string) string {
	var r [4]byte
	rand.Read(r[:])
	if len(base) > 200 {
		base = base[:200] // room for the rest within NAME_MAX
	}
	return "." + base + ".rdmacp-" + strconv.Itoa(os.Getpid()) + "-" + hostTag() + "-" + hex.EncodeToString(r[:]) + ".part"
}

// Is reports whether name is a temporary name of any run, live or not.
func Is(name string) bool { return nameRE.MatchString(name) }

// alive reports whether process pid exists: signal 0 is delivered to
// nothing, but fails with ESRCH for a pid no process has.
var alive = func(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Dead reports whether name (one path element) is the temporary file of a
// run of rdmacp on this host that is no longer running: a run that was
// killed before it could clean up. A name of another host, of a live
// process (or of one that reuses a dead run's pid) is never one.
func Dead(name string) bool {
	m := nameRE.FindStringSubmatch(name)
	if m == nil || m[3] != hostTag() {
		return false
	}
	pid, err := strconv.Atoi(m[2])
	if err != nil || pid <= 0 {
		return false
	}
	return !alive(pid)
}

// Clean removes, from directory dir of root, the leftovers of killed runs
// (Dead), whatever file they were for: temporary files, and staged trees
// (directories). It returns the paths it removed, relative to root.
func Clean(root *os.Root, dir string) []string {
	f, err := root.Open(dir)
	if err != nil {
		return nil
	}
	names, _ := f.Readdirnames(-1)
	f.Close()
	var gone []string
	for _, n := range names {
		if !Dead(n) {
			continue
		}
		p := path.Join(dir, n)
		if Remove(root, p) != nil {
			continue
		}
		gone = append(gone, p)
	}
	return gone
}

// Remove removes p, a file or a staged tree, from root. Everything goes
// through root: a link put in the tree's place is removed, never
// followed, and nothing outside root is changed.
func Remove(root *os.Root, p string) error {
	if root.RemoveAll(p) == nil {
		return nil
	}
	// A staged tree can hold directories with read-only modes.
	fs.WalkDir(root.FS(), p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			root.Chmod(q, 0o700)
		}
		return nil
	})
	return root.RemoveAll(p)
}
