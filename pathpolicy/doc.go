// Package pathpolicy decides which directories may become managed roots.
// Finding the processes that use a directory is package holders' job.
//
// # Path rules
//
// The rules are those of the seed document. CheckSyntax is a pure function
// of the path string: non-empty, at most 4096 bytes, no NUL byte (400
// invalid_field), absolute, clean, and not protected. "/", "/tmp" and
// "/var/tmp" are refused themselves; the trees in Protected and the
// caller's extra trees (guestd's stores) are refused together with their
// descendants and their ancestors (so /var, an ancestor of /var/lib/docker,
// is refused, and /var/tmp/project is fine).
//
// Policy.CheckEnroll adds the rules that need the filesystem and the mount
// table, for the first capture of a directory: no nesting with a managed
// root, every component an existing directory and no symlink, not a mount
// point, on an allowed mount, no mount below, and a tree without hardlinked
// regular files or special files (see CheckEnroll for the order).
// CheckTree is the tree walk alone, also used on overlay upper layers where
// whiteouts (character devices 0/0, all linked to one inode) are expected.
// Policy.CheckNoMountsBelow is the mount rule that still applies to a
// managed root at each capture.
//
// Every violation is a *fault.Error of kind Unprocessable with one of the
// Code constants, and Fields "path" (as requested) and, when one thing broke
// the rule, "offending" (the absolute path of that component, file or
// mount). Failures to read the filesystem, the mount table or /proc are
// plain errors: internal, logged, never shown to a client.
//
// # What it does not do
//
// It does not change the filesystem. CheckTree does not look at extended
// attributes: opaque directories and xattr whiteouts (6.7+) are plain
// directories and files to it.
//
// # Races
//
// Everything here is a time-of-check answer. A directory can gain a
// symlink, a hardlink or a mount the moment after it was checked. The tree
// walk opens every directory relative to its parent with O_NOFOLLOW, so a
// symlink swapped in for a directory during the walk is not followed.
package pathpolicy
