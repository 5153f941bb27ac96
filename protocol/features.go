package protocol

import (
	"strings"
	"time"
)

// Features are optional parts of the protocol that an initiator announces
// in Hello.Client: space-separated tokens "+NAME" after the software name,
// as ClientString writes them. A target does for an initiator only what
// the initiator announced, so older initiators see nothing new.
const (
	// FeatureWorking: the initiator understands Working messages.
	FeatureWorking = "working"
	// FeatureMeta: the initiator wants every Entry's Meta (owner, inode,
	// link count), in messages with FlagMeta.
	FeatureMeta = "meta"
	// FeatureXattrs: the initiator wants extended attributes (and so
	// POSIX ACLs) in Meta too. It implies FeatureMeta.
	FeatureXattrs = "xattrs"
	// FeatureWinDigests: the initiator takes chunk digests window by
	// window (Open does not hash the file; Digests hashes as it is
	// asked, one window ahead), asks for a file's data extents
	// (Extents), takes the whole-file digest at Close (Closed), and may
	// report a chunk that keeps failing (Suspect). A target that does
	// all this announces it in Challenge.Server.
	FeatureWinDigests = "windigests"
	// FeatureJoins, in Challenge.Server: the target takes a session's
	// data QPs in any order and connects them at once, so the initiator
	// may dial them all together (an older target takes index i only
	// after 0..i-1, one at a time: a join is two round trips, and 16 of
	// them took 6 s at 200 ms RTT).
	FeatureJoins = "joins"
	// FeaturePipeline (in Challenge.Server): the target serves a
	// session's requests strictly one after another, in the order sent,
	// with MaxOutstanding receives posted, so an initiator may send the
	// next request before the last is answered and count on it being
	// served after: Map k, Digests k, Map k+1… go out without waiting,
	// and the Digests of window k is served before Map k+1 moves the
	// target's hashing on (the target's Unmap before the Map that
	// follows frees its window). Without it, an initiator makes one
	// call at a time, as before.
	FeaturePipeline = "pipeline"
)

// WorkingInterval is how long a target serves a request before it sends
// the first Working for it, and how often it sends another.
const WorkingInterval = time.Second

// ClientString is a Hello.Client announcing features: name, then " +F"
// for each feature F, e.g. "rdmacp +working".
func ClientString(name string, features ...string) string {
	var b strings.Builder
	b.WriteString(name)
	for _, f := range features {
		b.WriteString(" +")
		b.WriteString(f)
	}
	return b.String()
}

// HasFeature reports whether Hello.Client string client announces
// feature. The first field is the software name, never a feature.
func HasFeature(client, feature string) bool {
	fields := strings.Fields(client)
	for i, f := range fields {
		if i > 0 && f == "+"+feature {
			return true
		}
	}
	return false
}
