package main

// Every line rdmacp prints with --json is one of these types, each with
// "message_type" first: scripts read them, so they live in one place and
// change here or nowhere. The commands fill them.

import "github.com/rdmacp/rdmacp/initiator"

// demoLine ends demo --json: the check the demo exists for.
type demoLine struct {
	Type      string `json:"message_type"` // "demo"
	Source    string `json:"source_sha256"`
	Copy      string `json:"copy_sha256"`
	Identical bool   `json:"identical"`
}

type benchLine struct {
	Type         string    `json:"message_type"`
	Status       string    `json:"status"`
	Source       string    `json:"source"`
	Transport    string    `json:"transport"`
	Choice       string    `json:"transport_choice"`
	QPs          int       `json:"qps"`
	Depth        int       `json:"depth"`
	Size         int       `json:"read_size"`
	Window       int64     `json:"window"`
	Reads        int64     `json:"reads"`
	Bytes        int64     `json:"bytes"`
	Seconds      float64   `json:"seconds"`
	AvgMBps      float64   `json:"avg_mb_per_s"`
	MinMBps      float64   `json:"min_mb_per_s"`
	PeakMBps     float64   `json:"peak_mb_per_s"`
	AvgGbps      float64   `json:"avg_gbit_per_s"`
	MinGbps      float64   `json:"min_gbit_per_s"`
	PeakGbps     float64   `json:"peak_gbit_per_s"`
	IntervalMs   float64   `json:"interval_ms"`
	Intervals    []float64 `json:"intervals_mb_per_s"`
	CPUSeconds   float64   `json:"cpu_seconds"`
	CPUSecsPerGB float64   `json:"cpu_seconds_per_gb"`
	QPFailures   int       `json:"qp_failures"`
	// The path and the bytes in flight the session settled on.
	ConnectRTTms  float64 `json:"connect_rtt_ms"`
	ReadRTTms     float64 `json:"read_rtt_ms"`
	Inflight      int64   `json:"inflight_bytes"`
	InflightStart int64   `json:"inflight_start_bytes"`
	InflightMax   int64   `json:"inflight_max_bytes"`
}

type summaryLine struct {
	Type      string  `json:"message_type"`
	Status    string  `json:"status"`
	Source    string  `json:"source"`
	Dest      string  `json:"dest"`
	Bytes     int64   `json:"bytes"`
	Seconds   float64 `json:"seconds"`
	MBps      float64 `json:"mb_per_s"`
	Transport string  `json:"transport"`
	QPs       int     `json:"qps"`
	Depth     int     `json:"depth"`
	ChunkSize int64   `json:"chunk_size"`
	Retries   int     `json:"chunk_retries"`
	Digest    string  `json:"digest"`
	BytesRead int64   `json:"bytes_read"`
	Skipped   bool    `json:"skipped,omitempty"`
	// Unchanged: skipped by the quick check (size and mtime), unread.
	Unchanged bool `json:"unchanged,omitempty"`
	DryRun    bool `json:"dry_run,omitempty"`
	// Recoveries: data QPs replaced and sessions re-established.
	Recoveries int `json:"recoveries"`
	// Rails are the paths the data QPs took and the bytes each carried.
	Rails []initiator.Rail `json:"rails,omitempty"`
	// RailsSkipped are the target's rail addresses not dialled, and why.
	RailsSkipped []initiator.SkippedRail `json:"rails_skipped,omitempty"`
	// RateCap: what capped the copy's rate (--bwlimit, the target's).
	RateCap *rateCapLine `json:"rate_cap,omitempty"`
}

type errorLine struct {
	Type     string `json:"message_type"`
	Error    string `json:"error"`
	ExitCode int    `json:"exit_code"`
}

// fileLine is the --json line for one file of a tree or manifest.
type fileLine struct {
	Type      string `json:"message_type"`
	Path      string `json:"path"`
	Source    string `json:"source,omitempty"`
	Dest      string `json:"dest,omitempty"`
	FileType  string `json:"type"`
	Status    string `json:"status"`
	Bytes     int64  `json:"bytes"`
	BytesRead int64  `json:"bytes_read"`
	Digest    string `json:"digest,omitempty"`
	Error     string `json:"error,omitempty"`
	ExitCode  int    `json:"exit_code,omitempty"`
	// PathEscaped: Path as escape.String writes it, only when Path is not
	// valid UTF-8 (see entryLine).
	PathEscaped string `json:"path_escaped,omitempty"`
}

// manySummary is the --json summary of a tree or manifest.
type manySummary struct {
	Type    string `json:"message_type"`
	Status  string `json:"status"` // ok, partial or failed
	Source  string `json:"source,omitempty"`
	Dest    string `json:"dest,omitempty"`
	Files   int    `json:"files"` // every entry: regular files, directories, symlinks, special files
	OK      int    `json:"files_ok"`
	Failed  int    `json:"files_failed"`
	Skipped int    `json:"files_skipped"`
	// Of Files, by type, and those found already in place (status
	// unchanged: the quick check, or a directory or symlink already there).
	Regular   int `json:"regular_files"`
	Dirs      int `json:"dirs"`
	Links     int `json:"symlinks"`
	Unchanged int `json:"files_unchanged"`
	// Of Unchanged: files an interrupted run of the same tree copy
	// finished (its journal says so), skipped without being read.
	SkippedDone int `json:"files_skipped_done"`
	// Deleted: entries --delete removed (with --dry-run, would remove).
	Deleted   int     `json:"deleted"`
	DryRun    bool    `json:"dry_run,omitempty"`
	Bytes     int64   `json:"bytes"`
	BytesRead int64   `json:"bytes_read"`
	Seconds   float64 `json:"seconds"`
	MBps      float64 `json:"mb_per_s"`
	// The session's: cp always has one, hash --json (this summary too)
	// none, and leaves them out.
	Transport string `json:"transport,omitempty"`
	QPs       int    `json:"qps,omitempty"`
	Depth     int    `json:"depth,omitempty"`
	ExitCode  int    `json:"exit_code"`
	// Recoveries: data QPs replaced and sessions re-established.
	Recoveries int              `json:"recoveries"`
	Rails      []initiator.Rail `json:"rails,omitempty"` // see railflags.go
	// RailsSkipped are the target's rail addresses not dialled, and why.
	RailsSkipped []initiator.SkippedRail `json:"rails_skipped,omitempty"`
}

type check struct {
	Type   string `json:"message_type"`
	Name   string `json:"check"`
	Status string `json:"status"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

type doctorSummary struct {
	Type string `json:"message_type"`
	OK   int    `json:"ok"`
	Warn int    `json:"warn"`
	Fail int    `json:"fail"`
	Skip int    `json:"skip"`
}

type entryLine struct {
	Type    string `json:"type"`
	Name    string `json:"name"`
	Mode    string `json:"mode"`
	Size    uint64 `json:"size"`
	Mtime   string `json:"mtime"`
	Target  string `json:"target,omitempty"`
	Message string `json:"message_type"`
	// NameEscaped and TargetEscaped: Name and Target as escape.String
	// writes them, only when they are not valid UTF-8, which JSON cannot
	// carry (encoding/json turns such bytes into U+FFFD).
	NameEscaped   string `json:"name_escaped,omitempty"`
	TargetEscaped string `json:"target_escaped,omitempty"`
}

type statusJSON struct {
	Type    string  `json:"message_type"`
	Path    string  `json:"path"`
	Bytes   int64   `json:"bytes"`
	Total   int64   `json:"total"`
	Seconds float64 `json:"seconds"`
	Retries int     `json:"chunk_retries"`
}

type recoveryLine struct {
	Type    string `json:"message_type"`
	Scope   string `json:"scope"`
	QP      *int   `json:"qp,omitempty"`
	Cause   string `json:"cause"`
	Outcome string `json:"outcome"`
	Attempt int    `json:"attempt,omitempty"`
	Error   string `json:"error,omitempty"`
	Time    string `json:"time"`
}
