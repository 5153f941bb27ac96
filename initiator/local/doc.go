// Package local is the initiator's own side of a copy: the files on this
// machine. It opens them without following links an attacker could swap
// in (safeopen.go), lands a copy in a temporary file that is fsynced and
// renamed onto DEST only once every chunk is verified (dest.go), writes
// zeros as holes, punched holes or --zero's ioctl and large files with
// O_DIRECT (sparse.go, direct.go), keeps what --partial needs to resume
// in a sidecar (resume.go), journals a tree copy's finished files
// (journal.go), and gives them what a copy keeps beyond their bytes:
// modes, owners, xattrs and ACLs (meta.go).
//
// It knows nothing of sessions, READs or targets: the initiator package
// decides what to copy and hands the verified bytes here.
package local
