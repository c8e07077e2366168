package layers

import (
	"bytes"
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"strata/internal/fault"
	"strata/internal/testenv"
)

// TestReadEntry reads files, symlinks and directory listings of a
// checkpoint from its layers, across a rename, a deletion and an opaque
// directory in later layers, and refuses absent paths, large files and
// bad paths with their codes.
func TestReadEntry(t *testing.T) {
	testenv.RequiresRootMounts(t)
	h := newHarness(t, false)
	ctx := context.Background()
	big := bytes.Repeat([]byte("x"), MaxEntryContent+1)
	exact := bytes.Repeat([]byte("y"), MaxEntryContent)
	dir := h.mkdir("project", func(d string) {
		write(t, d+"/a/f", "old f")
		write(t, d+"/a/g", "g")
		write(t, d+"/gone/x", "x")
		write(t, d+"/opaque/old", "old")
		must(t, os.WriteFile(d+"/big", big, 0o644))
		must(t, os.WriteFile(d+"/exact", exact, 0o640))
	})
	h.capture(dir, "base")
	must(t, os.Rename(dir+"/a", dir+"/b"))
	write(t, dir+"/b/f", "new f")
	must(t, os.RemoveAll(dir+"/gone"))
	must(t, os.RemoveAll(dir+"/opaque"))
	must(t, os.Mkdir(dir+"/opaque", 0o700))
	write(t, dir+"/opaque/new", "new")
	must(t, os.Symlink("b/f", dir+"/link"))
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	must(t, os.Chtimes(dir+"/b/g", mtime, mtime))
	cp := h.capture(dir, "later")
	write(t, dir+"/b/f", "unsaved")
	for _, c := range []struct {
		name, rel string
		want      Entry
		code      string
	}{
		{name: "file in a renamed directory", rel: "b/f", want: Entry{Path: "b/f", Type: TypeFile, Mode: 0o644, Size: 5, Content: []byte("new f")}},
		{name: "file from below, renamed with its directory", rel: "b/g", want: Entry{Path: "b/g", Type: TypeFile, Mode: 0o644, Size: 1, Content: []byte("g"), MTime: mtime}},
		{name: "file of exactly the limit", rel: "exact", want: Entry{Path: "exact", Type: TypeFile, Mode: 0o640, Size: MaxEntryContent, Content: exact}},
		{name: "symlink", rel: "link", want: Entry{Path: "link", Type: TypeSymlink, Mode: 0o777, Size: 3, Target: "b/f"}},
		{name: "root listing", rel: "", want: Entry{Path: ".", Type: TypeDir, Entries: []DirEntry{{"b", TypeDir}, {"big", TypeFile}, {"exact", TypeFile}, {"link", TypeSymlink}, {"opaque", TypeDir}}}},
		{name: "root as dot", rel: ".", want: Entry{Path: ".", Type: TypeDir}},
		{name: "opaque directory", rel: "opaque", want: Entry{Path: "opaque", Type: TypeDir, Mode: 0o700, Entries: []DirEntry{{"new", TypeFile}}}},
		{name: "renamed away", rel: "a/f", code: ErrEntryNotFound.Code},
		{name: "deleted directory", rel: "gone", code: ErrEntryNotFound.Code},
		{name: "under an opaque directory", rel: "opaque/old", code: ErrEntryNotFound.Code},
		{name: "under a file", rel: "big/x", code: ErrEntryNotFound.Code},
		{name: "too large", rel: "big", code: ErrFileTooLarge.Code},
		{name: "absolute", rel: "/b/f", code: "invalid_field"},
		{name: "dot dot", rel: "../x", code: "invalid_field"},
		{name: "not clean", rel: "b//f", code: "invalid_field"},
		{name: "dot dot inside", rel: "b/../b/f", code: "invalid_field"},
		{name: "trailing slash", rel: "b/", code: "invalid_field"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := h.store.ReadEntry(ctx, cp.ID, c.rel)
			if c.code != "" {
				if fault.CodeOf(err) != c.code {
					t.Fatalf("ReadEntry(%q) = %+v, %v; want %s", c.rel, got, err, c.code)
				}
				if fe := fault.As(err); c.code == ErrFileTooLarge.Code && fe.Fields["size"] != int64(len(big)) {
					t.Fatalf("file_too_large carries size %v, want %d", fe.Fields["size"], len(big))
				}
				return
			}
			if err != nil {
				t.Fatalf("ReadEntry(%q): %v", c.rel, err)
			}
			if c.rel == "." {
				if got.Path != "." || got.Type != TypeDir || len(got.Entries) != 5 {
					t.Fatalf("ReadEntry(\".\") = %+v", got)
				}
				return
			}
			if c.want.MTime.IsZero() {
				got.MTime = time.Time{}
			}
			if c.want.Type == TypeDir {
				// A directory's size and times follow its entries.
				got.Size, got.MTime = 0, time.Time{}
				if c.want.Mode == 0 {
					got.Mode = 0
				}
			}
			if !entryEqual(got, c.want) {
				t.Fatalf("ReadEntry(%q) = %+v\nwant %+v", c.rel, trimEntry(got), trimEntry(c.want))
			}
		})
	}
	if _, err := h.store.ReadEntry(ctx, "cp_nope", "b/f"); fault.CodeOf(err) != ErrCheckpointNotFound.Code {
		t.Fatalf("unknown checkpoint: %v", err)
	}
}

func entryEqual(a, b Entry) bool {
	return a.Path == b.Path && a.Type == b.Type && a.Mode == b.Mode && a.Size == b.Size && a.MTime.Equal(b.MTime) &&
		bytes.Equal(a.Content, b.Content) && a.Target == b.Target && slices.Equal(a.Entries, b.Entries)
}

// trimEntry shortens content for messages.
func trimEntry(e Entry) Entry {
	if len(e.Content) > 16 {
		e.Content = e.Content[:16]
	}
	return e
}
