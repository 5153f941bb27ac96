package local

import (
	"os"
	"path"
	"path/filepath"

	"github.com/rdmacp/rdmacp/leftover"
)

// TempName is the temporary name for rel ('/'-separated), in rel's
// directory.
func TempName(rel string) string {
	return path.Join(path.Dir(rel), leftover.Name(path.Base(rel)))
}

// CleanLeftovers removes, from directory dir, the leftovers of killed
// runs (leftover.Clean), whatever file they were for: a 1 GiB .part in
// /dev/shm is RAM, and waiting for a copy to the same name to clear it
// could wait for ever. It returns their paths.
func CleanLeftovers(dir string) []string {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil
	}
	defer root.Close()
	gone := leftover.Clean(root, ".")
	for i, g := range gone {
		gone[i] = filepath.Join(dir, filepath.FromSlash(g))
	}
	return gone
}
