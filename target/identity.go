package target

// identity is the name the session authenticated as: "default" for the
// single shared secret (or none). A placeholder for the metrics' and the
// access log's label: the per-client keys replace this file.
func (ss *session) identity() string { return "default" }
