package hostproxytest

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/jsend"
	"strata/pathpolicy"
)

// The routes beyond the seed's four (issue 8), as the double answers
// them: each checkpoint may be given a file tree (SetTree), and the live
// directory of a path one too (SetLiveTree); changes compare two trees
// by brute force, the files route reads one, restore-paths copies paths
// of a checkpoint's tree into the live one, clone starts a new directory
// from a checkpoint, and release deletes a directory's checkpoints.

// More operations, for SetFault.
const (
	OpChanges      Op = "changes"
	OpFiles        Op = "files"
	OpRestorePaths Op = "restore-paths"
	OpClone        Op = "clone"
	OpRelease      Op = "release"
)

// File is an entry of a double's tree: a file (Content), a symlink
// (Target) or a directory (Type "dir"; directories are also implied by
// the paths below them).
type File struct {
	Type    string // "file" (default), "symlink" or "dir"
	Content string
	Target  string
	Mode    uint32 // 0644 (files), 0777 (symlinks), 0755 (directories) when 0
}

// Tree is a file tree by path relative to the root ("a/b.txt").
type Tree map[string]File

// FileMTime is the mtime of every entry of a double's tree.
var FileMTime = time.Date(2026, 11, 5, 9, 0, 0, 0, time.UTC)

var (
	errEntryNotFound = fault.New(fault.NotFound, "entry_not_found", "the checkpoint has no entry at this path")
	errNotManaged    = fault.New(fault.NotFound, "directory_not_managed", "no managed directory has this path")
)

// SetTree gives checkpoint id a file tree.
func (g *FakeGuest) SetTree(id string, t Tree) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.trees[id] = t
}

// SetLiveTree gives the live directory at path a file tree.
func (g *FakeGuest) SetLiveTree(path string, t Tree) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.live[path] = t
}

// LiveTree is the live directory's tree at path (after restore-paths).
func (g *FakeGuest) LiveTree(path string) Tree {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := Tree{}
	for k, v := range g.live[path] {
		out[k] = v
	}
	return out
}

// full adds the directories the paths of t imply and fills defaults.
func (t Tree) full() map[string]File {
	out := map[string]File{}
	for p, f := range t {
		if f.Type == "" {
			f.Type = "file"
		}
		if f.Mode == 0 {
			f.Mode = map[string]uint32{"file": 0o644, "symlink": 0o777, "dir": 0o755}[f.Type]
		}
		out[p] = f
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndex(d, "/")]
			if _, ok := out[d]; !ok {
				out[d] = File{Type: "dir", Mode: 0o755}
			}
		}
	}
	return out
}

func (f File) size() int64 {
	switch f.Type {
	case "file":
		return int64(len(f.Content))
	case "symlink":
		return int64(len(f.Target))
	}
	return 0
}

// routeBeyond answers the routes of this file; ok is false for others.
func (g *FakeGuest) routeBeyond(r *http.Request, parts []string) (data any, ok bool, err error) {
	switch {
	case len(parts) == 2 && parts[0] == "directories" && parts[1] == "release" && r.Method == http.MethodPost:
		data, err = g.release(r)
		return data, true, err
	case len(parts) == 1 && parts[0] == "exec" && r.Method == http.MethodPost:
		data, err = g.exec(r)
		return data, true, err
	case len(parts) < 3 || parts[0] != "checkpoints":
		return nil, false, nil
	}
	id := parts[1]
	switch {
	case len(parts) == 3 && parts[2] == "changes" && r.Method == http.MethodGet:
		data, err = g.changes(r, id)
	case len(parts) >= 3 && parts[2] == "files" && r.Method == http.MethodGet:
		data, err = g.file(r, id)
	case len(parts) == 3 && parts[2] == "restore-paths" && r.Method == http.MethodPost:
		data, err = g.restorePaths(r, id)
	case len(parts) == 3 && parts[2] == "clone" && r.Method == http.MethodPost:
		data, err = g.clone(r, id)
	default:
		return nil, false, nil
	}
	return data, true, err
}

func (g *FakeGuest) changes(r *http.Request, id string) (any, error) {
	if err := jsend.RejectBody(r); err != nil {
		return nil, err
	}
	against, err := api.ParseChangesQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i, err := g.find(id)
	if err != nil {
		return nil, err
	}
	cp := g.checkpoints[i]
	if err := g.faultFor(OpChanges, cp.Path); err != nil {
		return nil, err
	}
	newer := g.trees[id].full()
	var older map[string]File
	switch {
	case against == "":
		older = g.trees[cp.ParentID].full()
	case against == api.AgainstLive:
		older, newer = newer, g.live[cp.Path].full()
	default:
		j, err := g.find(against)
		if err != nil {
			return nil, err
		}
		if g.checkpoints[j].Path != cp.Path {
			return nil, jsend.InvalidField("against", "against must be a checkpoint of the same directory")
		}
		older = g.trees[against].full()
	}
	out := []api.Change{}
	for p, f := range newer {
		o, had := older[p]
		switch {
		case !had:
			out = append(out, api.Change{Path: p, Change: "added", Type: f.Type, Size: f.size()})
		case o != f:
			out = append(out, api.Change{Path: p, Change: "modified", Type: f.Type, Size: f.size()})
		}
	}
	for p, o := range older {
		if _, ok := newer[p]; !ok {
			out = append(out, api.Change{Path: p, Change: "deleted", Type: o.Type, Size: o.size()})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Path < out[b].Path })
	return out, nil
}

func (g *FakeGuest) file(r *http.Request, id string) (any, error) {
	if err := jsend.RejectQueryAndBody(r); err != nil {
		return nil, err
	}
	rel, _ := strings.CutPrefix(r.URL.EscapedPath(), "/v1/checkpoints/"+id+"/files")
	rel = strings.TrimPrefix(rel, "/")
	rel, err := url.PathUnescape(rel)
	if err != nil {
		return nil, err
	}
	if rel, err = api.ParseEntryPath(rel); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i, err := g.find(id)
	if err != nil {
		return nil, err
	}
	if err := g.faultFor(OpFiles, g.checkpoints[i].Path); err != nil {
		return nil, err
	}
	tree := g.trees[id].full()
	f, ok := tree[rel]
	if rel == "" {
		f, ok = File{Type: "dir", Mode: 0o755}, true
	}
	if !ok {
		return nil, errEntryNotFound.With("path", rel)
	}
	shown := rel
	if shown == "" {
		shown = "."
	}
	e := api.Entry{Path: shown, Type: f.Type, Mode: api.FormatMode(f.Mode), Size: f.size(), MTime: api.FormatMTime(FileMTime)}
	switch f.Type {
	case "file":
		c := []byte(f.Content)
		e.Content = &c
	case "symlink":
		t := f.Target
		e.Target = &t
	case "dir":
		es := []api.DirEntry{}
		prefix := rel + "/"
		if rel == "" {
			prefix = ""
		}
		for p, c := range tree {
			if name, ok := strings.CutPrefix(p, prefix); ok && name != "" && !strings.Contains(name, "/") {
				es = append(es, api.DirEntry{Name: name, Type: c.Type})
			}
		}
		sort.Slice(es, func(a, b int) bool { return es[a].Name < es[b].Name })
		e.Entries = &es
	}
	return e, nil
}

func (g *FakeGuest) restorePaths(r *http.Request, id string) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.RestorePathsRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i, err := g.find(id)
	if err != nil {
		return nil, err
	}
	cp := g.checkpoints[i]
	if err := g.faultFor(OpRestorePaths, cp.Path); err != nil {
		return nil, err
	}
	live := Tree{}
	for k, v := range g.live[cp.Path] {
		live[k] = v
	}
	under := func(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	for _, root := range req.Paths {
		for p := range live {
			if under(p, root) {
				delete(live, p)
			}
		}
		for p, f := range g.trees[id] {
			if under(p, root) {
				live[p] = f
			}
		}
	}
	g.live[cp.Path] = live
	return api.RestorePathsResult{CheckpointID: id, Path: cp.Path, Paths: req.Paths}, nil
}

func (g *FakeGuest) clone(r *http.Request, id string) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.PathRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	p, err := req.Validate()
	if err != nil {
		return nil, err
	}
	if err := pathpolicy.CheckSyntax(p, nil); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, err := g.find(id); err != nil {
		return nil, err
	}
	if err := g.faultFor(OpClone, p); err != nil {
		return nil, err
	}
	if _, ok := g.head[p]; ok {
		return nil, fault.New(fault.Unprocessable, "path_nested", "The directory is a parent or child of another managed directory.").With("path", p).With("offending", p)
	}
	g.head[p] = id
	g.live[p] = g.trees[id]
	return api.CloneResult{Path: p, FromCheckpointID: id}, nil
}

func (g *FakeGuest) release(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	var req api.PathRequest
	if err := jsend.DecodeObject(r, &req); err != nil {
		return nil, err
	}
	p, err := req.Validate()
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.faultFor(OpRelease, p); err != nil {
		return nil, err
	}
	if _, ok := g.head[p]; !ok {
		return nil, errNotManaged.With("path", p)
	}
	ids := []string{}
	kept := g.checkpoints[:0]
	for _, cp := range g.checkpoints {
		if cp.Path == p {
			ids = append(ids, cp.ID)
			continue
		}
		kept = append(kept, cp)
	}
	g.checkpoints = kept
	delete(g.head, p)
	return api.ReleaseResult{Path: p, DeletedCheckpointIDs: ids}, nil
}

// exec runs the one program the double knows, the CLI's read of a live
// file (sh -c '…cat…' sh PATH): a regular file of a live tree is its
// content, anything else exit status 3. Any other program is refused.
func (g *FakeGuest) exec(r *http.Request) (any, error) {
	req, _, err := api.ReadExec(r)
	if err != nil {
		return nil, err
	}
	if len(req.Cmd) != 5 || req.Cmd[0] != "sh" || req.Cmd[1] != "-c" {
		return nil, fault.New(fault.Unprocessable, api.CodeExecFailed, "the fake guest runs only the read of a live file")
	}
	path := req.Cmd[4]
	g.mu.Lock()
	defer g.mu.Unlock()
	res := api.ExecResult{ExitCode: 3}
	for dir, t := range g.live {
		rel, ok := strings.CutPrefix(path, dir+"/")
		if f, found := t[rel]; ok && found && (f.Type == "" || f.Type == "file") {
			res.ExitCode = 0
			res.Stdout = base64.StdEncoding.EncodeToString([]byte(f.Content))
		}
	}
	if req.Encoding != api.EncodingBase64 {
		return nil, fault.New(fault.Unprocessable, api.CodeExecFailed, "the fake guest answers the read of a live file in base64 only")
	}
	return res, nil
}
