package layers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"strata/internal/api"
	"strata/internal/fault"
	"strata/layers/meta"
	"strata/pathpolicy"
)

// Restore of single paths. The named paths of the live directory become
// what they are in a checkpoint; nothing else changes. It works through
// the live mount (no new stack): each path's checkpoint version is built
// under a hidden name next to it (materialize, from the checkpoint's
// layers read without mounting), the filesystem is synced, and then one
// rename puts it in place (RENAME_EXCHANGE over the live version, which
// is then removed). A path the checkpoint lacks is renamed away and
// removed. So each path is, at every instant, its before or its after
// state, never a mix.
//
// Crash safety: the hidden names and the parent directories the
// operation makes are recorded in the root's record (meta.PathsIntent)
// before anything is made, and cleared after the renames reached the
// disk. Recovery (and the next RestorePaths of the root) removes what the
// record lists: a hidden name holds either the new version (the crash came
// before its rename: the path keeps its before state) or the old one
// (after: the path has its after state), and a parent made for a path is
// removed only if empty (rmdir).

// stagePrefix starts the hidden names a restore of paths builds under.
const stagePrefix = ".strata-restore-"

// restorePathList checks paths and returns them sorted, each once, and
// without those under another listed path (the outer one covers them).
func restorePathList(paths []string) ([]string, error) {
	if len(paths) == 0 || len(paths) > MaxRestorePaths {
		return nil, fault.New(fault.Invalid, "invalid_field", fmt.Sprintf("paths: want 1 to %d paths", MaxRestorePaths)).
			With("field", "paths").With("limit", MaxRestorePaths)
	}
	for _, p := range paths {
		if err := api.ValidateRelPath("paths", p); err != nil {
			return nil, err
		}
	}
	out := slices.Clone(paths)
	slices.Sort(out)
	out = slices.Compact(out)
	return slices.DeleteFunc(out, func(p string) bool {
		for _, q := range out {
			if strings.HasPrefix(p, q+"/") {
				return true
			}
		}
		return false
	}), nil
}

// RestorePaths makes each of paths (relative to the root) of the live
// directory of checkpoint id what it is in the checkpoint: recursively,
// and removed when the checkpoint lacks it. The rest of the directory is
// untouched. The busy rules are restore's. It returns the checkpoint and
// its directory.
func (s *Store) RestorePaths(ctx context.Context, id string, paths []string) (Checkpoint, error) {
	rels, err := restorePathList(paths)
	if err != nil {
		return Checkpoint{}, err
	}
	_, root, err := s.lookup(id)
	if err != nil {
		return Checkpoint{}, err
	}
	done, err := s.begin(root.Path)
	if err != nil {
		return Checkpoint{}, err
	}
	defer done()
	// Unsaved changes are kept first, as a restore keeps them: an
	// automatic checkpoint, by a capture (the paths about to be replaced
	// may hold some), once the paths are known to be restorable.
	var safety string
	if s.cfg.AutoCheckpoints > 0 {
		if err := s.view(func(t meta.Tx) (err error) {
			root, err = t.Root(root.ID)
			if err == nil && root == nil {
				err = ErrCheckpointNotFound.With("checkpoint_id", id)
			}
			return err
		}); err != nil {
			return Checkpoint{}, err
		}
		if err := s.finishPaths(ctx, root); err != nil {
			return Checkpoint{}, err
		}
		changed, err := s.unsaved(root.Active)
		if err != nil {
			return Checkpoint{}, err
		}
		if changed {
			if err := s.checkPaths(id, root, rels); err != nil {
				return Checkpoint{}, err
			}
			o := s.newOp(ctx, opCapture, root.Path)
			cp, err := s.capture(o, root, "before restoring paths of "+id, meta.Request{}, options{auto: true, except: id})
			o.done(err)
			if err != nil {
				return Checkpoint{}, err
			}
			safety = cp.ID
		}
	}
	o := s.newOp(ctx, opRestorePaths, root.Path)
	err = s.restorePaths(o, id, rels)
	o.done(err)
	if err != nil {
		return Checkpoint{}, err
	}
	return Checkpoint{ID: id, Path: root.Path, SafetyCheckpointID: safety}, nil
}

// checkPaths runs the path checks of a restore of rels from checkpoint id
// on root's live directory, changing nothing: a request refused there is
// refused before the safety capture.
func (s *Store) checkPaths(id string, root *meta.Root, rels []string) error {
	src, _, _, err := s.checkpointTree(id)
	if err != nil {
		return err
	}
	defer src.Close()
	live, err := s.liveTree(root)
	if err != nil {
		return err
	}
	defer live.Close()
	for _, rel := range rels {
		if _, err := planPath(src, live, root.Path, rel); err != nil {
			return err
		}
	}
	return nil
}

// pathPlan is what the restore of one path does.
type pathPlan struct {
	rel    string
	inCP   bool     // the checkpoint has an entry at rel
	inLive bool     // the live directory has one
	make   []string // parents to make (from the checkpoint), outermost first
	stage  string   // the hidden name in rel's parent
}

func (s *Store) restorePaths(o *op, id string, rels []string) error {
	src, _, root, err := s.checkpointTree(id)
	if err != nil {
		return err
	}
	defer src.Close()
	path := root.Path
	// A restore of paths that did not finish (guestd still running):
	// clear what it left first.
	if err := s.finishPaths(o.ctx, root); err != nil {
		return err
	}
	var h *rootHandle
	defer func() { h.Close() }()
	if err := o.step(stepMountCheck, func() (err error) {
		h, err = s.openSettled(o.ctx, root)
		return err
	}); err != nil {
		return err
	}
	if err := o.step(stepValidateMounts, func() error { return pathpolicy.CheckNoMountsIn(path, h.table) }); err != nil {
		return err
	}
	if err := o.step(stepBusyCheck, func() error {
		pending, err := s.busyCheckMounted(o.ctx, root, h)
		if err != nil {
			return err
		}
		return pending()
	}); err != nil {
		return err
	}
	if err := o.step(stepSpaceCheck, func() error { return s.checkSpace(path, false) }); err != nil {
		return err
	}
	live, err := s.liveTree(root)
	if err != nil {
		return err
	}
	defer live.Close()
	// Every path is checked before anything changes: a refused path
	// leaves all of them as they were.
	var plans []*pathPlan
	if err := o.step(stepValidatePath, func() error {
		for _, rel := range rels {
			p, err := planPath(src, live, path, rel)
			if err != nil {
				return err
			}
			if p != nil {
				plans = append(plans, p)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	intent := &meta.PathsIntent{}
	for _, p := range plans {
		intent.Made = append(intent.Made, p.make...)
		intent.Staged = append(intent.Staged, filepath.Join(filepath.Dir(p.rel), p.stage))
	}
	if err := o.step(stepIntent, func() error { return s.setPathsIntent(root.ID, intent) }); err != nil {
		return err
	}
	root.Paths = intent // undo clears what the record lists
	// From here the intent must be cleared, by this operation or by
	// recovery: a client that hangs up does not stop it half way.
	o.ctx = context.WithoutCancel(o.ctx)
	undo := func(cause error) error {
		if err := s.finishPaths(o.ctx, root); err != nil {
			s.log.Error("undo a restore of paths", "path", path, "err", err)
		}
		return cause
	}
	if err := o.step(stepMaterialize, func() error {
		made := map[string]bool{}
		for _, p := range plans {
			if err := stagePath(o.ctx, src, live, p, made); err != nil {
				return err
			}
		}
		// The new versions reach the disk before any rename shows them.
		return syncFD(live.root)
	}); err != nil {
		return undo(err)
	}
	if err := o.step(stepPlace, func() error {
		for _, p := range plans {
			if err := replacePath(live, p); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return undo(err)
	}
	// The old versions, now under the hidden names, go; the renames and
	// the removals reach the disk before the intent is cleared.
	if err := o.step(stepCommit, func() error {
		if err := removeStaged(live, intent); err != nil {
			return err
		}
		if err := madeTimes(src, live, intent.Made); err != nil {
			return err
		}
		if err := syncFD(live.root); err != nil {
			return err
		}
		return s.setPathsIntent(root.ID, nil)
	}); err != nil {
		return undo(err)
	}
	return nil
}

// planPath checks rel in the live directory against the checkpoint and
// says what restoring it does; nil when nothing (both lack it). display
// is the root's path, for errors.
func planPath(src tree, live *dirTree, display, rel string) (*pathPlan, error) {
	p := &pathPlan{rel: rel, stage: stagePrefix + randomSuffix()}
	_, err := src.Lstat(rel)
	switch {
	case err == nil:
		p.inCP = true
	case !absent(err):
		return nil, err
	}
	// The live parents: directories, or absent (made from the
	// checkpoint when it has the path).
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		anc := strings.Join(parts[:i], "/")
		st, err := live.Lstat(anc)
		if errors.Is(err, fs.ErrNotExist) {
			if !p.inCP {
				return nil, nil // neither has it
			}
			for j := i; j < len(parts); j++ {
				p.make = append(p.make, strings.Join(parts[:j], "/"))
			}
			return p, nil
		}
		if err != nil {
			return nil, err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return nil, pathpolicy.Violation(pathpolicy.CodePathSymlink, filepath.Join(display, rel), filepath.Join(display, anc),
				"A parent of the path is a symlink in the live directory; restore that parent instead.")
		default:
			return nil, pathpolicy.Violation(pathpolicy.CodePathNotDirectory, filepath.Join(display, rel), filepath.Join(display, anc),
				"A parent of the path is not a directory in the live directory; restore that parent instead.")
		}
	}
	_, err = live.Lstat(rel)
	switch {
	case err == nil:
		p.inLive = true
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	if !p.inCP && !p.inLive {
		return nil, nil
	}
	return p, nil
}

// absent reports whether err says a path is not there: it does not exist,
// or a parent of it is not a directory.
func absent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR)
}

// stagePath makes p's missing parents (as the checkpoint has them; made
// lists those this operation made already) and builds the checkpoint's
// version of p under its hidden name.
func stagePath(ctx context.Context, src tree, live *dirTree, p *pathPlan, made map[string]bool) error {
	for _, m := range p.make {
		if made[m] {
			continue // made for an earlier path of this operation
		}
		made[m] = true
		st, err := src.Lstat(m)
		if err != nil {
			return err
		}
		fd, name, err := live.parent(m)
		if err != nil {
			return err
		}
		if err := unix.Mkdirat(fd, name, 0o700); err != nil {
			// Something made it since validate.path (EEXIST): it is not
			// ours to change; the operation fails and undoes.
			return &os.PathError{Op: "mkdirat", Path: m, Err: err}
		}
		// The owner and mode go to the directory just made, by handle: a
		// name swapped for a symlink meanwhile is refused, never followed.
		dfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "openat", Path: m, Err: err}
		}
		err = unix.Fchown(dfd, int(st.Uid), int(st.Gid))
		if err == nil {
			err = unix.Fchmod(dfd, st.Mode&0o7777)
		}
		unix.Close(dfd)
		if err != nil {
			return &os.PathError{Op: "fchown/fchmod", Path: m, Err: err}
		}
	}
	if !p.inCP {
		return nil
	}
	fd, _, err := live.parent(p.rel)
	if err != nil {
		return err
	}
	return materialize(ctx, src, p.rel, fd, p.stage)
}

// replacePath puts p's staged version in place: an exchange with the live
// version, a rename where there is none, or (the checkpoint lacks it) the
// live version renamed to the hidden name.
func replacePath(live *dirTree, p *pathPlan) error {
	fd, name, err := live.parent(p.rel)
	if err != nil {
		return err
	}
	var rerr error
	switch {
	case p.inCP && p.inLive:
		rerr = unix.Renameat2(fd, p.stage, fd, name, unix.RENAME_EXCHANGE)
	case p.inCP:
		rerr = unix.Renameat2(fd, p.stage, fd, name, unix.RENAME_NOREPLACE)
	default:
		rerr = unix.Renameat2(fd, name, fd, p.stage, unix.RENAME_NOREPLACE)
	}
	if rerr != nil {
		return &os.PathError{Op: "rename", Path: p.rel, Err: rerr}
	}
	return nil
}

// removeStaged removes the hidden names of intent (whatever they hold) and
// the parents it made that are empty, deepest first.
func removeStaged(live *dirTree, intent *meta.PathsIntent) error {
	for _, st := range intent.Staged {
		fd, name, err := live.parent(st)
		if absent(err) || errors.Is(err, unix.ELOOP) {
			// Its parent was never made, or is no longer a directory of
			// ours (a symlink put there): nothing of ours to remove.
			continue
		}
		if err != nil {
			return err
		}
		if err := removeAllAt(fd, name); err != nil {
			return err
		}
	}
	made := slices.Clone(intent.Made)
	slices.SortFunc(made, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, m := range made {
		fd, name, err := live.parent(m)
		if absent(err) || errors.Is(err, unix.ELOOP) {
			continue
		}
		if err != nil {
			return err
		}
		// rmdir removes only an empty directory: one that holds a
		// restored path, or that is not a directory any more, stays.
		err = unix.Unlinkat(fd, name, unix.AT_REMOVEDIR)
		if err != nil && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			return &os.PathError{Op: "rmdir", Path: m, Err: err}
		}
	}
	return nil
}

// madeTimes gives the parents the operation made the checkpoint's times,
// deepest first (making an entry inside changes a directory's times).
func madeTimes(src tree, live *dirTree, made []string) error {
	made = slices.Clone(made)
	slices.SortFunc(made, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, m := range made {
		st, err := src.Lstat(m)
		if err != nil {
			return err
		}
		fd, name, err := live.parent(m)
		if err != nil {
			return err
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(fd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: m, Err: err}
		}
	}
	return nil
}

// removeAllAt removes name in the directory dirfd and everything under
// it, following no symlink; an absent name is not an error.
func removeAllAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return &os.PathError{Op: "unlinkat", Path: name, Err: err}
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "openat", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAllAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "rmdir", Path: name, Err: err}
	}
	return nil
}

// setPathsIntent records (nil: clears) the restore of paths under way on
// root.
func (s *Store) setPathsIntent(rootID uint64, in *meta.PathsIntent) error {
	return s.update(func(t meta.Tx) error {
		r, err := t.Root(rootID)
		if err != nil {
			return err
		}
		if r == nil {
			return fmt.Errorf("managed root %d: %w", rootID, meta.ErrInconsistent)
		}
		r.Paths = in
		return t.PutRoot(r)
	})
}

// finishPaths clears what an interrupted restore of paths left on root
// (see the top of this file): its hidden names and the empty parents it
// made, then the intent.
func (s *Store) finishPaths(ctx context.Context, root *meta.Root) error {
	if root.Paths == nil {
		return nil
	}
	h, err := s.openSettled(ctx, root)
	if err != nil {
		return err
	}
	h.Close()
	live, err := s.liveTree(root)
	if err != nil {
		return err
	}
	defer live.Close()
	if err := removeStaged(live, root.Paths); err != nil {
		return err
	}
	if err := syncFD(live.root); err != nil {
		return err
	}
	if err := s.setPathsIntent(root.ID, nil); err != nil {
		return err
	}
	root.Paths = nil
	return nil
}

// syncFD syncs the filesystem of the open fd (syncfs).
func syncFD(fd int) error {
	if err := unix.Syncfs(fd); err != nil {
		return &os.PathError{Op: "syncfs", Path: "", Err: err}
	}
	return nil
}

// randomSuffix is 12 random hex digits.
func randomSuffix() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
