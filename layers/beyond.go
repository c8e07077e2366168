package layers

import (
	"time"

	"strata/internal/api"
	"strata/internal/fault"
)

// The operations beyond the seed's four (issue 8): what a checkpoint
// changed, files from the past, restore of single paths, clones, release
// and export. Their types and errors are here; each operation lives in
// its own file (changes.go, read.go, paths.go, clone.go, release.go,
// export.go).

// Change is one difference between two states of a managed directory.
type Change struct {
	// Path is relative to the root ("a/b.txt").
	Path string
	// Change is ChangeAdded, ChangeModified or ChangeDeleted.
	Change string
	// Type is TypeFile, TypeDir or TypeSymlink: the entry's type in the
	// newer state (the older for a deletion).
	Type string
	// Size is the entry's size in that state (bytes; a symlink's target
	// length; a directory's st_size).
	Size int64
}

// Change kinds.
const (
	ChangeAdded    = "added"
	ChangeModified = "modified"
	ChangeDeleted  = "deleted"
)

// Entry types.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
)

// AgainstLive, as Changes' against, compares the live directory with the
// checkpoint.
const AgainstLive = "live"

// Entry is one entry as it is in a checkpoint (the files route).
type Entry struct {
	Path  string
	Type  string
	Mode  uint32 // permission bits and setuid/setgid/sticky (not the type)
	Size  int64
	MTime time.Time
	// Content is a file's content (files of at most MaxEntryContent).
	Content []byte
	// Target is a symlink's target.
	Target string
	// Entries lists a directory, sorted by name.
	Entries []DirEntry
}

// DirEntry is a name in a directory listing and its type.
type DirEntry struct {
	Name string
	Type string
}

// MaxEntryContent is the largest file ReadEntry returns the content of.
const MaxEntryContent = 4 << 20

// MaxRestorePaths is how many paths one RestorePaths may name (the API's
// limit).
const MaxRestorePaths = api.MaxRestorePaths

// MaxCheckpoints is how many checkpoints one directory may hold (the
// API's limit).
const MaxCheckpoints = api.MaxCheckpoints

// DefaultAutoCheckpoints is how many automatic checkpoints guestd keeps
// per directory unless told otherwise.
const DefaultAutoCheckpoints = 5

// Errors of the operations beyond the seed's four.
var (
	ErrEntryNotFound   = fault.New(fault.NotFound, "entry_not_found", "the checkpoint has no entry at this path")
	ErrFileTooLarge    = fault.New(fault.TooLarge, "file_too_large", "the file is larger than 4 MiB; restore it or read it in the sandbox")
	ErrCheckpointLimit = fault.New(fault.Conflict, "checkpoint_limit", "the directory holds the most checkpoints it may; delete some, or create with retention delete_oldest")
	// ErrCheckpointOtherDirectory answers a comparison with a checkpoint
	// of another managed directory.
	ErrCheckpointOtherDirectory = fault.New(fault.Unprocessable, "checkpoint_other_directory", "the checkpoint to compare with belongs to another directory")
	// ErrLiveUnavailable answers a read of a live directory whose mount is
	// not in place (the next operation on it remounts it).
	ErrLiveUnavailable = fault.New(fault.Conflict, "directory_unavailable", "the directory's live mount is not in place; retry after the next operation on it")
)
