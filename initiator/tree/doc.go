// Package tree is rsync's policy over an initiator session: a directory
// tree (cp -r), a list of files, or a manifest of lines (--from), copied
// with -a's metadata, --delete, --partial, excludes, shards and the quick
// check.
//
// It walks the source with the session's Walk (or List, for a quick check
// into a DEST that exists), has small files packed many to a round trip,
// pulls the rest one at a time with Session.Pull, and lands everything
// through initiator/local: a tree that did not exist is built in a stage
// and renamed into place whole; into one that does, files land under
// temporary names and are renamed in batches, after one sync, so that a
// crash never leaves a file that looks complete. Names from the target
// are checked before anything is made for them: nothing lands outside
// DEST.
package tree
