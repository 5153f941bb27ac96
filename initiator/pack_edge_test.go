package initiator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/protocol"
)

func TestPackEdgeCases(t *testing.T) {
	e := rig.Start(t, nil)
	want := rig.RandomFile(t, filepath.Join(e.Dir, "ok"), 3000)
	rig.RandomFile(t, filepath.Join(e.Dir, "empty"), 0)
	rig.RandomFile(t, filepath.Join(e.Dir, "huge"), 300<<10) // over the 256 KiB window limit
	os.Mkdir(filepath.Join(e.Dir, "dir"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(e.Dir, "escape"))
	s := e.Dial(t, nil)
	paths := []string{"data/ok", "data/missing", "data/dir", "data/huge", "data/empty", "data/../x", "data/escape", "data/ok"}
	var got []string
	err := initiator.GetPacked(s, context.Background(), paths, func(i int, en protocol.Entry, data []byte, err error) error {
		var pe *protocol.Error
		switch {
		case err == nil:
			got = append(got, fmt.Sprintf("%d:%d", i, len(data)))
			if i == 0 && !bytes.Equal(data, want) {
				t.Error("ok: content differs")
			}
		case errors.As(err, &pe):
			got = append(got, fmt.Sprintf("%d:%v", i, pe.Code))
		default:
			got = append(got, fmt.Sprintf("%d:%v", i, err))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := "0:3000 1:not found 2:unsupported 3:too many 4:0 5:permission denied 6:permission denied 7:3000"; strings.Join(got, " ") != w {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, " "), w)
	}
	// Every pack's handle was closed: the session can open its limit again.
	if _, err := s.Get(context.Background(), "data/ok", filepath.Join(t.TempDir(), "x"), initiator.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
