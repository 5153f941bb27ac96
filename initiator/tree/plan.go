package tree

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmacp/rdmacp/initiator"
	"github.com/rdmacp/rdmacp/protocol"
)

// ManifestOptions tune GetManifest.
type ManifestOptions struct {
	// Recursive copies a line whose source is a directory as a tree
	// (Get); without it such a line fails (protocol.CodeIsDir).
	Recursive bool
	// Force, Partial, SkipSame and NoDirect are GetOptions' for each
	// line copied as a file; Partial, SkipSame and NoDirect are the
	// trees' too.
	Force, Partial, SkipSame, NoDirect bool
	// QuickCheck: see initiator.GetOptions.QuickCheck; for lines copied as files
	// one by one or as trees (packed lines are always copied).
	QuickCheck bool
	// ModifyWindow: see initiator.GetOptions.ModifyWindow.
	ModifyWindow time.Duration
	// NoPack copies every line on its own (and a tree's small files one
	// by one), instead of runs of small files many to a request.
	NoPack bool
	// DryRun reports what each line would do (StatusWouldCopy,
	// StatusUnchanged, a tree's entries as Get's DryRun) and changes
	// nothing; every line is then judged on its own.
	DryRun bool
	// Delete is Options.Delete for each line copied as a tree: what
	// its DEST has and its source does not goes. File lines have nothing
	// to delete.
	Delete bool
	// Progress, if set, is called as line i starts being copied on its
	// own as a file (not packed, not a tree) and returns what that copy
	// reports its progress to (GetOptions.Progress; nil for nothing).
	Progress func(i int) func(initiator.Progress)
	// File, if set, is told each outcome once it is final: of line i
	// itself (tree false; Path is its destination), or of an entry of
	// line i copied as a tree (tree true; Path is relative to the tree's
	// root). A tree line that succeeds is told only its entries.
	File func(i int, fr FileResult, tree bool)
}

// GetManifest copies the lines of a manifest (each job a remote path and
// where it goes) in order over s. A line whose source is a directory is
// a tree (with Recursive), any other a file. Runs of small files go many
// to a request (GetMany) unless SkipSame, Partial or NoPack asks for each
// to be copied on its own. A line that fails is told to File and does not
// stop the others; GetManifest returns only an error that stops every
// line: the connection, or ctx.
func GetManifest(ctx context.Context, s *initiator.Session, jobs []FileJob, opt ManifestOptions) error {
	return newSession(s).getManifest(ctx, jobs, opt)
}

func (s *session) getManifest(ctx context.Context, jobs []FileJob, opt ManifestOptions) error {
	file := func(i int, fr FileResult, tree bool) {
		if opt.File != nil {
			opt.File(i, fr, tree)
		}
	}
	one := func(i int) error {
		fr, err := s.getLine(ctx, i, jobs[i], opt, file)
		if err != nil {
			return err
		}
		if fr != nil {
			file(i, *fr, false)
		}
		return nil
	}
	if !opt.SkipSame && !opt.Partial && !opt.NoPack && !opt.DryRun {
		return s.getMany(ctx, jobs, func(i int, fr FileResult) { file(i, fr, false) }, one)
	}
	for i := range jobs {
		if err := one(i); err != nil {
			return err
		}
	}
	return nil
}

// lineKind is how one line of a manifest is copied.
type lineKind int

const (
	lineFile    lineKind = iota // Get: a file, or whatever Get makes of it
	lineTree                    // Get: a directory, with Recursive
	lineRefused                 // a directory without Recursive
)

// planLine decides how a line whose source is e is copied.
func planLine(e protocol.Entry, recursive bool) lineKind {
	switch {
	case e.Type != protocol.FileDir:
		return lineFile
	case recursive:
		return lineTree
	}
	return lineRefused
}

// stopsAll reports whether err, of one line, stops the whole manifest:
// the connection is gone, or ctx is done.
func stopsAll(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, initiator.ErrConnect)
}

// getLine copies line i of a manifest, job, on its own. It returns the
// line's outcome (nil for a tree, whose entries it told file one by one),
// or an error that stops the whole manifest.
func (s *session) getLine(ctx context.Context, i int, job FileJob, opt ManifestOptions, file func(int, FileResult, bool)) (*FileResult, error) {
	src, dst := job.Src, job.Dst
	fr := &FileResult{Path: dst, Type: protocol.FileRegular, Status: StatusFailed}
	e, err := s.Stat(ctx, src)
	if err != nil {
		if stopsAll(ctx, err) {
			return nil, err
		}
		fr.Err = fmt.Errorf("%s: %w", src, err)
		return fr, nil
	}
	switch planLine(e, opt.Recursive) {
	case lineRefused:
		fr.Type = e.Type
		fr.Err = &protocol.Error{Code: protocol.CodeIsDir, Message: src + " is a directory (add -r to copy trees)"}
		return fr, nil
	case lineTree:
		fr.Type = e.Type
		// A manifest line maps SRC to DEST: DEST is the copy, so the same
		// manifest run twice leaves the same tree.
		_, err := s.getTree(ctx, src, dst, Options{Contents: true, SkipSame: opt.SkipSame, NoPack: opt.NoPack, Partial: opt.Partial, NoDirect: opt.NoDirect, QuickCheck: opt.QuickCheck, ModifyWindow: opt.ModifyWindow,
			DryRun: opt.DryRun, Delete: opt.Delete, File: func(f FileResult) { file(i, f, true) }})
		if err != nil {
			if stopsAll(ctx, err) {
				return nil, err
			}
			fr.Err = err
			return fr, nil
		}
		return nil, nil
	}
	var progress func(initiator.Progress)
	if opt.Progress != nil {
		progress = opt.Progress(i)
	}
	res, err := s.Get(ctx, src, dst, initiator.GetOptions{Progress: progress, Force: opt.Force, Partial: opt.Partial, SkipSame: opt.SkipSame, NoDirect: opt.NoDirect, QuickCheck: opt.QuickCheck, ModifyWindow: opt.ModifyWindow, DryRun: opt.DryRun})
	if res != nil {
		fr.BytesRead = res.BytesRead
		if res.Dest != "" {
			fr.Path = res.Dest
		}
	}
	if err != nil {
		if stopsAll(ctx, err) {
			return nil, err
		}
		fr.Err = fmt.Errorf("%s: %w", src, err)
		return fr, nil
	}
	fr.Status, fr.Bytes, fr.Digest = StatusOK, res.Bytes, res.Digest
	switch {
	case res.Unchanged:
		fr.Status = StatusUnchanged
	case res.Skipped && opt.DryRun:
		fr.Status = StatusUnchanged // as a tree's dry run says it
	case res.Skipped:
		fr.Status = StatusSame
	case opt.DryRun:
		fr.Status = StatusWouldCopy
	}
	return fr, nil
}
