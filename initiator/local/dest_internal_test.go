package local

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A temporary file that cannot be made is reported by the name the user
// gave (DEST), with the cause kept for the exit code, not by the
// temporary name beside it, which the user never typed.
func TestCreateTempNamesDest(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "no such dir", "one.txt")
	_, err := createTemp(dst, 10)
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Path != dst || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("createTemp(%q): %v; want a PathError for DEST, ENOENT", dst, err)
	}
	if strings.Contains(err.Error(), ".part") {
		t.Errorf("the error names the temporary file: %v", err)
	}
}
