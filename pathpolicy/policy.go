package pathpolicy

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
)

// DefaultAllowedMounts are the mount points whose mounts may hold managed
// roots when Policy.AllowedMounts is nil.
var DefaultAllowedMounts = []string{"/", "/tmp", "/var/tmp"}

// Policy checks directories against the path rules that need the
// filesystem and the mount table. The zero value checks the real root with
// the live mount table.
type Policy struct {
	// Root is "" or "/" for the real root. Tests point it at a temporary
	// directory holding a fake tree: paths are checked as given, and
	// filesystem calls go to Root+path. The mount table is not rewritten:
	// MountInfo must then describe mount points as given too.
	Root string
	// MountInfo returns the mount table of the caller's mount namespace.
	// nil means mountinfo.GetMounts(nil).
	MountInfo func() ([]*mountinfo.Info, error)
	// AllowedMounts are the mount points whose mounts may hold managed
	// roots. A directory whose containing mount (the longest mount point at
	// or above it) is not one of them is on a separate mount: path_mount.
	// nil means DefaultAllowedMounts.
	AllowedMounts []string
	// ExtraProtected are guestd's store directories, protected like
	// Protected: the tree, its descendants and its ancestors.
	ExtraProtected []string
}

// CheckEnroll checks a directory that is about to become a managed root, at
// its first capture. The rules run in this order, and the first broken one
// is returned:
//
//  1. CheckSyntax (invalid_field, path_not_absolute, path_not_clean,
//     path_protected);
//  2. it is not a parent or a child of any path in managed (path_nested;
//     the same path is fine), checked early because a managed root below
//     path is also a mount point, and path_nested says more;
//  3. every component exists (path_not_found, offending is the first
//     missing one), none is a symlink (path_symlink) and every component
//     but the last is a directory, and the last is a directory too
//     (path_not_directory);
//  4. the path is not a mount point, its containing mount is allowed, and no
//     mount point lies below it (path_mount);
//  5. the tree below holds no hardlinked regular file (path_hardlink) and no
//     socket, device or FIFO (path_special_file), as CheckTree.
//
// The walk watches ctx and returns ctx.Err() when cancelled. Failures to
// read the filesystem or the mount table are unclassified (internal) errors.
func (p *Policy) CheckEnroll(ctx context.Context, path string, managed []string) error {
	if err := p.CheckEnrollPath(path, managed); err != nil {
		return err
	}
	return CheckTree(ctx, p.fsPath(path), false, displayUnder(path))
}

// CheckEnrollPath runs the rules of CheckEnroll that concern the path and
// the mount table (1 to 4), not the tree below it. guestd runs it, then
// opens the directory by handle and runs CheckTreeFD on that handle, so
// that the tree it checks is the one it enrolls.
func (p *Policy) CheckEnrollPath(path string, managed []string) error {
	if err := CheckSyntax(path, p.ExtraProtected); err != nil {
		return err
	}
	if err := checkNested(path, managed); err != nil {
		return err
	}
	if err := p.checkComponents(path); err != nil {
		return err
	}
	mounts, err := p.mounts()
	if err != nil {
		return err
	}
	return p.checkMounts(path, mounts)
}

// CheckNewPath checks a path that is to become a new managed root and
// must not exist yet (a clone's): the rules of CheckEnrollPath, with the
// components checked up to the parent, which must be a directory, and
// the path itself refused when anything is there (path_exists, whatever
// it is, a dangling symlink too). The caller creates the directory with
// a rename that refuses to replace, so a path made after this check is
// still refused.
func (p *Policy) CheckNewPath(path string, managed []string) error {
	if err := CheckSyntax(path, p.ExtraProtected); err != nil {
		return err
	}
	if err := checkNested(path, managed); err != nil {
		return err
	}
	if err := p.checkComponents(filepath.Dir(path)); err != nil {
		if fe := fault.As(err); fe != nil && fe.Fields != nil {
			fe.Fields["path"] = path // the path asked for, not its parent
		}
		return err
	}
	var st unix.Stat_t
	switch err := unix.Lstat(p.fsPath(path), &st); {
	case err == nil:
		return ErrPathExists(path)
	case errors.Is(err, unix.ENAMETOOLONG):
		return violation(CodePathNotFound, path, path, "The name is longer than the filesystem allows.")
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("pathpolicy: lstat %s: %w", p.fsPath(path), err)
	}
	mounts, err := p.mounts()
	if err != nil {
		return err
	}
	return p.checkMounts(path, mounts)
}

// ErrPathExists is the 422 for a path that must not exist and does.
func ErrPathExists(path string) error {
	return violation(CodePathExists, path, path, "Something already exists at this path; name one that does not exist yet.")
}

// displayUnder maps a path relative to the directory path to the path the
// user sees.
func displayUnder(path string) func(rel string) string {
	return func(rel string) string {
		if rel == "" {
			return path
		}
		return path + "/" + rel
	}
}

// CheckNoMountsBelow fails with path_mount when a mount point lies strictly
// below path. guestd runs it on a managed root at each capture: the managed
// root itself is a mount point, and that is fine.
func (p *Policy) CheckNoMountsBelow(path string) error {
	mounts, err := p.mounts()
	if err != nil {
		return err
	}
	return CheckNoMountsIn(path, mounts)
}

// CheckNoMountsIn is CheckNoMountsBelow against a mount table the caller
// has just read (the one it opened the directory with), saving a second
// read of mountinfo.
func CheckNoMountsIn(path string, mounts []*mountinfo.Info) error {
	if mp := firstBelow(path, mounts); mp != "" {
		return violation(CodePathMount, path, mp, "The directory contains a mount point.")
	}
	return nil
}

// checkNested refuses a parent or a child of a managed root.
func checkNested(path string, managed []string) error {
	for _, m := range managed {
		m = filepath.Clean(m)
		if m != path && related(path, m) {
			return violation(CodePathNested, path, m,
				"The directory is a parent or a child of another checkpoint-managed directory.")
		}
	}
	return nil
}

// checkComponents lstats every prefix of path, from the top. path is
// absolute and clean and not "/" (CheckSyntax refuses it).
func (p *Policy) checkComponents(path string) error {
	var st unix.Stat_t
	for i := 1; i <= len(path); i++ {
		if i < len(path) && path[i] != '/' {
			continue
		}
		prefix := path[:i]
		if err := unix.Lstat(p.fsPath(prefix), &st); err != nil {
			switch {
			case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENAMETOOLONG):
				// A name longer than the filesystem allows cannot exist.
				return violation(CodePathNotFound, path, prefix, "The directory does not exist.")
			case errors.Is(err, unix.ENOTDIR):
				// Unreachable unless the tree changes under us: the parent
				// was a directory a moment ago.
				return violation(CodePathNotDirectory, path, filepath.Dir(prefix), "The path is not a directory.")
			}
			return fmt.Errorf("pathpolicy: lstat %s: %w", p.fsPath(prefix), err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return violation(CodePathSymlink, path, prefix, "The path contains a symlink.")
		default:
			return violation(CodePathNotDirectory, path, prefix, "The path is not a directory.")
		}
	}
	return nil
}

// checkMounts applies the mount rules to path.
func (p *Policy) checkMounts(path string, mounts []*mountinfo.Info) error {
	var containing string
	for _, m := range mounts {
		mp := m.Mountpoint
		if mp == path {
			return violation(CodePathMount, path, path, "The directory is a mount point.")
		}
		if under(path, mp) && len(mp) > len(containing) {
			containing = mp
		}
	}
	if containing == "" {
		// No mount at or above path: the table is not this namespace's, or
		// it is a test's partial fake. Refuse rather than guess.
		return violation(CodePathMount, path, path, "The directory is not on a supported mount.")
	}
	allowed := p.AllowedMounts
	if allowed == nil {
		allowed = DefaultAllowedMounts
	}
	ok := false
	for _, a := range allowed {
		if filepath.Clean(a) == containing {
			ok = true
			break
		}
	}
	if !ok {
		return violation(CodePathMount, path, containing, "The directory is on a separate mount.")
	}
	if mp := firstBelow(path, mounts); mp != "" {
		return violation(CodePathMount, path, mp, "The directory contains a mount point.")
	}
	return nil
}

// firstBelow returns the smallest mount point strictly below path, or "".
func firstBelow(path string, mounts []*mountinfo.Info) string {
	var below []string
	for _, m := range mounts {
		if under(m.Mountpoint, path) {
			below = append(below, m.Mountpoint)
		}
	}
	if len(below) == 0 {
		return ""
	}
	sort.Strings(below)
	return below[0]
}

func (p *Policy) mounts() ([]*mountinfo.Info, error) {
	get := p.MountInfo
	if get == nil {
		get = func() ([]*mountinfo.Info, error) { return mountinfo.GetMounts(nil) }
	}
	ms, err := get()
	if err != nil {
		return nil, fmt.Errorf("pathpolicy: read mount table: %w", err)
	}
	return ms, nil
}

// fsPath is where the filesystem calls for path go.
func (p *Policy) fsPath(path string) string {
	root := strings.TrimRight(p.Root, "/")
	if root == "" {
		return path
	}
	return root + path
}
