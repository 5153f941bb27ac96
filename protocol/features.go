package protocol

import (
	"strings"
	"time"
)

// Features are what an initiator asks of a session in Hello.Client:
// space-separated tokens "+NAME" after the software name, as ClientString
// writes them. They are wishes (what metadata to send), not protocol
// generations: version 1 has one feature set, and a peer that speaks
// another version is refused at Hello.
const (
	// FeatureMeta: the initiator wants every Entry's Meta (owner, inode,
	// link count), in messages with FlagMeta.
	FeatureMeta = "meta"
	// FeatureXattrs: the initiator wants extended attributes (and so
	// POSIX ACLs) in Meta too. It implies FeatureMeta.
	FeatureXattrs = "xattrs"
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
