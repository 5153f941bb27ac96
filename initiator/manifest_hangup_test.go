package initiator_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/initiator/internal/rig"
	"github.com/rdmacp/rdmacp/initiator/tree"
)

// A line that fails because the connection is gone stops the manifest:
// GetManifest returns its error, and tells no later line.
func TestGetManifestStopsWithTheConnection(t *testing.T) {
	e := rig.Start(t, nil)
	rig.RandomFile(t, filepath.Join(e.Dir, "big"), 300<<10)
	out := t.TempDir()
	for _, opt := range []tree.ManifestOptions{{}, {NoPack: true}} {
		s := e.Dial(t, nil)
		initiator.HangUp(s)
		jobs := []tree.FileJob{{Src: "data/big", Dst: filepath.Join(out, "a")}, {Src: "data/big", Dst: filepath.Join(out, "b")}}
		var told []int
		opt.File = func(i int, fr tree.FileResult, _ bool) { told = append(told, i) }
		err := tree.GetManifest(context.Background(), s, jobs, opt)
		if !errors.Is(err, initiator.ErrConnect) {
			t.Errorf("%+v: %v, want ErrConnect", opt, err)
		}
		if len(told) != 0 {
			t.Errorf("%+v: told lines %v", opt, told)
		}
	}
}
