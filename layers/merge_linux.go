package layers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// merge writes into dst (an empty directory) one layer equivalent to the
// layers srcs stacked, oldest first, over the layers below (topmost
// first): an overlay mount of dst over below shows what a mount of srcs
// over below shows, at every path. The result is in the upper-layer
// format: whiteouts, opaque directories and redirects, so that the layers
// below still show through where they should and nowhere else.
//
// It reads the layers the way overlayfs looks them up (stackView): a
// directory that a src layer renamed (trusted.overlay.redirect) shows the
// contents the layers under it hold at the redirect's target. A merged
// directory gets trusted.overlay.opaque=y where the lookup stopped inside
// srcs and below would show something at its path, and an absolute
// trusted.overlay.redirect where the lookup must go on in below at a path
// other than its own.
//
// Regular files are clones of the sources where the filesystem can clone
// (clone: FICLONE shares the blocks, so no data is copied, and each file
// keeps a link count of its own), and hard links to them where it cannot
// (sealed layers never change, so sharing inodes is safe and costs no
// data, but a file's link count then counts the store's links too);
// directories, symlinks and whiteouts are made anew. The cost is a few syscalls per
// entry, never per byte. A whiteout is made only where below shows the
// name it hides: overlayfs lists a directory that exists in one layer only
// straight from that layer, so a whiteout with nothing under it would show
// up in readdir as a name that cannot be looked up.
func merge(ctx context.Context, dst string, srcs, below []string, clone bool) error {
	if len(srcs) == 0 {
		return errors.New("merge: no layers to merge")
	}
	v := &stackView{nsrc: len(srcs), clone: clone}
	for i := len(srcs) - 1; i >= 0; i-- {
		v.dirs = append(v.dirs, srcs[i])
	}
	v.dirs = append(v.dirs, below...)
	root := &mergedDir{}
	for l := range v.nsrc {
		root.srcs = append(root.srcs, layerPath{layer: l})
	}
	// The merged root takes the attributes of the topmost src's root (a
	// squashed layer's root gives a restore its attributes).
	if err := copyDirAttrs(v.dirs[0], dst); err != nil {
		return err
	}
	if err := v.mergeDir(ctx, root, dst, 0); err != nil {
		return err
	}
	// Entries made inside changed the root's times; put them back.
	return copyTimes(v.dirs[0], dst)
}

// copyTimes gives dst the atime and mtime of src.
func copyTimes(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: dst, Err: err}
	}
	return nil
}

const (
	xattrOpaque   = "trusted.overlay.opaque"
	xattrRedirect = "trusted.overlay.redirect"
)

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(dir string) bool {
	v, err := getXattr(dir, xattrOpaque)
	return err == nil && string(v) == "y"
}

func setOpaque(dir string) error {
	if err := unix.Lsetxattr(dir, xattrOpaque, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr opaque", Path: dir, Err: err}
	}
	return nil
}

func setRedirect(dir, target string) error {
	if err := unix.Lsetxattr(dir, xattrRedirect, []byte(target), 0); err != nil {
		return &os.PathError{Op: "setxattr redirect", Path: dir, Err: err}
	}
	return nil
}

// maxMergeDepth bounds the merged tree's depth: layers the kernel wrote
// never nest deeper than a path can reach, and a redirect loop (which
// only a hand-made layer could hold) must end in an error.
const maxMergeDepth = 2048

// stackView reads a stack of layer directories the way overlayfs looks
// them up (fs/overlayfs/namei.c: ovl_lookup, ovl_lookup_layer,
// ovl_lookup_single, ovl_check_redirect), with redirect_dir on and
// metacopy off. dirs are the layers topmost first: the srcs of a merge,
// then the layers below them.
type stackView struct {
	dirs  []string
	nsrc  int
	clone bool // regular files are cloned, not hard-linked (see merge)
}

// layerPath is where one layer holds an entry: the layer's index in dirs
// and the entry's path from the layer's root ("" is the root).
type layerPath struct {
	layer int
	path  string
}

// mergedDir is a directory of the merged layer: where the src layers hold
// it, topmost first, and where the lookup goes on in the layers below.
type mergedDir struct {
	srcs []layerPath
	// stopped: the lookup ended in the srcs (an opaque directory, a
	// whiteout or a file under it), so below shows nothing in it.
	stopped bool
	// below is, unless stopped, the directory's path from the root of the
	// first layer below: a walk from there, following the redirects of
	// the layers below, finds it in each of them.
	below string
}

// lookupState is the kernel's struct ovl_lookup_data, what one lookup
// carries from layer to layer.
type lookupState struct {
	// name is what is looked up: an entry name inside the parent, or,
	// after an absolute redirect, a path from the layer root ("/a/b").
	name       string
	redirected bool // name is no longer the entry's own (d->redirect)
	isDir      bool // a directory was found: only directories merge with it
	stop       bool // the layers further down are not looked at
	// st is the stat of the entry found last (saves a second lstat).
	st unix.Stat_t
}

// single looks up name in the directory base of layer, as
// ovl_lookup_single does; post is the rest of an absolute path after
// name ("" when name is its last element) and prelen where name starts in
// d.name.
func (v *stackView) single(d *lookupState, layer int, base, name string, prelen int, post string) (string, bool, error) {
	p := path.Join(base, name)
	full := filepath.Join(v.dirs[layer], p)
	st := &d.st
	if err := unix.Lstat(full, st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENAMETOOLONG) {
			return "", false, nil
		}
		return "", false, &os.PathError{Op: "lstat", Path: full, Err: err}
	}
	last := post == ""
	if isWhiteout(st) {
		d.stop = true
		return "", false, nil
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		// A file ends the lookup; it is the result only as the last
		// element and when no directory was found above it.
		d.stop = true
		if d.isDir || !last {
			return "", false, nil
		}
		return p, true, nil
	}
	if last {
		d.isDir = true
	}
	if layer == len(v.dirs)-1 {
		return p, true, nil // the bottom layer: nothing left to stop or redirect
	}
	if isOpaque(full) {
		d.stop = true
		return p, true, nil
	}
	if err := v.checkRedirect(d, full, prelen, post); err != nil {
		return "", false, err
	}
	return p, true, nil
}

// checkRedirect applies the redirect of the directory full, if it has one,
// to d, as ovl_check_redirect does: an absolute one replaces the whole
// path looked up (and lifts a stop an opaque ancestor set), a relative
// one replaces the element that starts at prelen.
func (v *stackView) checkRedirect(d *lookupState, full string, prelen int, post string) error {
	val, err := getXattr(full, xattrRedirect)
	if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "getxattr redirect", Path: full, Err: err}
	}
	r := string(val)
	if !validRedirect(r) {
		// The kernel fails the lookup (EINVAL); a merge must not guess.
		return fmt.Errorf("invalid redirect %q on %s", r, full)
	}
	if r[0] == '/' {
		d.stop = false
		d.name = r + post
	} else {
		d.name = d.name[:prelen] + r + post
	}
	d.redirected = true
	return nil
}

// validRedirect reports whether the kernel follows r as a redirect: an
// entry name, or a path from the root of entry names. (It refuses empty
// names when it reads the xattr, and "." and ".." when it looks them up.)
func validRedirect(r string) bool {
	if r == "" {
		return false
	}
	names := []string{r}
	if r[0] == '/' {
		names = strings.Split(r[1:], "/")
	} else if strings.Contains(r, "/") {
		return false
	}
	for _, n := range names {
		if n == "" || n == "." || n == ".." {
			return false
		}
	}
	return true
}

// lookupLayer looks up d.name in layer, as ovl_lookup_layer does: an entry
// name inside base, or an absolute path walked from the layer root one
// element at a time, where each element's redirect rewrites the rest of
// the path for the layers further down (counted from the end, as the
// prefix may change length).
func (v *stackView) lookupLayer(d *lookupState, layer int, base string) (string, bool, error) {
	if !strings.HasPrefix(d.name, "/") {
		return v.single(d, layer, base, d.name, 0, "")
	}
	rem := len(d.name) - 1
	cur := ""
	for {
		s := len(d.name) - rem
		n := strings.IndexByte(d.name[s:], '/')
		if n < 0 {
			n = len(d.name) - s
		}
		post := d.name[s+n:]
		p, ok, err := v.single(d, layer, cur, d.name[s:s+n], s, post)
		if err != nil || !ok {
			return "", false, err
		}
		if post == "" {
			return p, true, nil
		}
		cur = p
		rem -= n + 1
	}
}

// lookup looks up the entry name of dir in the src layers, as ovl_lookup
// does, and says where the lookup goes on below them: found lists the src
// layers that hold the entry, topmost first (the first decides what it
// is, top is its stat; only directories come after it).
func (v *stackView) lookup(dir *mergedDir, name string) (found []layerPath, top unix.Stat_t, child mergedDir, err error) {
	d := lookupState{name: name}
	at := dir.srcs // the parent's layers; after an absolute redirect, every layer's root
	absolute := false
	for i := 0; i < len(at) && !d.stop; i++ {
		e := at[i]
		p, ok, err := v.lookupLayer(&d, e.layer, e.path)
		if err != nil {
			return nil, top, mergedDir{}, err
		}
		if !ok {
			continue
		}
		if len(found) == 0 {
			top = d.st
		}
		found = append(found, layerPath{layer: e.layer, path: p})
		if d.stop {
			break
		}
		if d.redirected && strings.HasPrefix(d.name, "/") && !absolute {
			absolute = true
			at = nil
			for l := e.layer + 1; l < v.nsrc; l++ {
				at = append(at, layerPath{layer: l})
			}
			i = -1
		}
	}
	child.srcs = found
	switch {
	case d.stop:
		child.stopped = true
	case strings.HasPrefix(d.name, "/"):
		child.below = d.name[1:]
	case dir.stopped:
		child.stopped = true // the parent's layers end in the srcs
	default:
		child.below = path.Join(dir.below, d.name)
	}
	return found, top, child, nil
}

// shownBelow reports whether the layers below the srcs show an entry at
// rel (a path from their root), as a lookup that reaches them would find
// it: an absolute walk that follows their redirects, stopped by opaque
// directories and whiteouts, is the same lookup as the one that comes
// down from the parent directory's layers.
func (v *stackView) shownBelow(rel string) (bool, error) {
	d := lookupState{name: "/" + rel}
	for l := v.nsrc; l < len(v.dirs) && !d.stop; l++ {
		_, ok, err := v.lookupLayer(&d, l, "")
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// mergeDir writes into dst the entries of the merged directory dir.
func (v *stackView) mergeDir(ctx context.Context, dir *mergedDir, dst string, depth int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if depth > maxMergeDepth {
		return fmt.Errorf("merge: %s is deeper than %d directories (a redirect loop?)", dst, maxMergeDepth)
	}
	names, err := v.dirNames(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		found, st, child, err := v.lookup(dir, name)
		if err != nil {
			return err
		}
		d := filepath.Join(dst, name)
		natural := path.Join(dir.below, name)
		if len(found) == 0 {
			// Hidden by a whiteout in the srcs.
			if dir.stopped {
				continue
			}
			shown, err := v.shownBelow(natural)
			if err != nil {
				return err
			}
			if shown {
				if err := unix.Mknod(d, unix.S_IFCHR, 0); err != nil {
					return &os.PathError{Op: "mknod whiteout", Path: d, Err: err}
				}
			}
			continue
		}
		src := filepath.Join(v.dirs[found[0].layer], found[0].path)
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if v.clone && st.Mode&unix.S_IFMT == unix.S_IFREG {
				err := cloneFile(src, d, &st)
				if err == nil {
					continue
				}
				// A file this filesystem will not clone (a realtime or
				// DAX file on XFS): a hard link, as where none clones.
				if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EXDEV) {
					return err
				}
			}
			if err := copyEntry(src, d, &st); err != nil {
				return err
			}
			continue
		}
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		// The topmost layer's directory gives the attributes, as in a mount.
		if err := copyDirAttrs(src, d); err != nil {
			return err
		}
		switch {
		case child.stopped:
			if !dir.stopped {
				shown, err := v.shownBelow(natural)
				if err != nil {
					return err
				}
				if shown {
					if err := setOpaque(d); err != nil {
						return err
					}
				}
			}
		case child.below == "":
			return fmt.Errorf("merge: %s redirects to the root", src)
		case dir.stopped || child.below != natural:
			// An absolute path in the first below layer's terms stands for
			// any chain of redirects: the kernel's walk follows the
			// redirects the layers below hold on the way.
			if err := setRedirect(d, "/"+child.below); err != nil {
				return err
			}
		}
		if err := v.mergeDir(ctx, &child, d, depth+1); err != nil {
			return err
		}
		// Entries made inside changed the times; put them back.
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, d, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: d, Err: err}
		}
	}
	return nil
}

// copyEntry makes dst the non-directory src: a hard link for a regular
// file, a new symlink with the same owner and times for a symlink.
func copyEntry(src, dst string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := unix.Link(src, dst); err != nil {
			return &os.LinkError{Op: "link", Old: src, New: dst, Err: err}
		}
		return nil
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return &os.PathError{Op: "lchown", Path: dst, Err: err}
		}
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "utimensat", Path: dst, Err: err}
		}
		return nil
	default:
		// Layers hold no special files but whiteouts (the capture rules
		// refuse them); keep whatever is there rather than lose it.
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknod", Path: dst, Err: err}
		}
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return &os.PathError{Op: "lchown", Path: dst, Err: err}
		}
		return copyXattrs(src, dst)
	}
}
