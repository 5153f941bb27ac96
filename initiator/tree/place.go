package tree

import (
	"os"
	"path"
	"path/filepath"

	"github.com/rdmacp/rdmacp/initiator/local"
)

// Where a copy lands follows rsync, so that the same command run twice
// leaves the tree one run leaves (a nightly job must not nest a second
// copy inside the first, as cp -r and scp -r do on the second night):
//
//   - a tree named without a trailing slash lands as DEST/NAME; with one
//     (Options.Contents), its contents land in DEST;
//   - a file lands in DEST/NAME when DEST is a directory or is written
//     with a trailing slash, else at DEST;
//   - DEST itself is made when it is missing (a tree's DEST, a file's
//     DEST/), but not the directories above it unless MkPath asks
//     (rsync's --mkpath).

// treeTop is the directory Get makes src into.
func treeTop(src, dst string, contents bool) string {
	if contents {
		return filepath.Clean(dst)
	}
	return filepath.Join(dst, path.Base(src))
}

// makeTreeDest makes what a tree copy to top needs, as rsync does: DEST
// (not the directories above it, but with MkPath), or for Contents only
// MkPath's parents; then top's directory must exist.
func makeTreeDest(dst, top string, opt Options) error {
	var err error
	if opt.Contents {
		err = local.MakeParents(top, opt.MkPath, opt.DryRun)
		if fi, serr := os.Stat(top); err == nil && serr == nil && !fi.IsDir() {
			// SRC/ onto a file: said as for SRC, not as mkdir's ENOTDIR.
			err = local.DestNotDir(top)
		}
	} else {
		err = local.MakeDestDir(dst, opt.MkPath, opt.DryRun)
	}
	if err == nil && !opt.DryRun {
		err = local.DestDirExists(top)
	}
	return err
}
