// Package layers is strata's directory checkpoint engine: it turns a plain
// directory into a managed root (an overlayfs mount over a chain of
// layers), takes checkpoints of it, restores and deletes them, and keeps
// every step safe to crash in the middle of.
//
// The model, in short (docs/design.md has the long form):
//
//   - A Store serves one filesystem: numbered layer directories under
//     <store>/layers, staging in tmp/, deletion in trash/, and the
//     metadata (package meta). One guestd owns a store at a time: Open
//     takes the store's lock before it touches anything.
//   - A managed root is a directory inode, not a path: enrollment (the
//     first capture) exchanges the directory's contents into the store as
//     the base layer and leaves an empty, immutable mountpoint at the path,
//     whose (device, inode) the root record keeps. Every operation opens
//     the parent by handle and checks that identity before it acts, and
//     names the root by (parent fd, name) afterwards: a rename or a
//     symlink between two steps cannot redirect it. A root whose path no
//     longer leads to it is "moved" (409 directory_moved), never mounted
//     twice.
//   - A layer is an overlayfs upper directory, active (the live, writable
//     upper) or sealed (never changes again). A checkpoint names a sealed
//     layer; its content is that layer's chain. Capture asks the kernel
//     whether the live mount is in use (umount2 MNT_EXPIRE: EBUSY is the
//     busy gate; the /proc scan only names the holders), syncs, freezes
//     the mount (read-only, this mount only: EBUSY again for a writer),
//     syncs what changed since, seals the upper, commits, and slides a
//     new stack (package overlay) under the old one; the old
//     superblock's end (a write-back) runs in the background. Restore puts a fresh upper on a checkpoint's
//     layer. Delete drops a record; mark-and-sweep frees the layers
//     nothing needs once no mount uses them.
//   - Compaction merges runs of sealed layers into spans so that a stack
//     stays within log2(n)+3 lower layers; squash merges a layer no
//     checkpoint names into its only child. A merge reads layers as
//     overlayfs looks them up, redirects of renamed directories included
//     (merge_linux.go), and clones files where the filesystem can (exact
//     link counts), hard-linking them elsewhere.
//   - A clone is a new managed root whose first upper sits on a
//     checkpoint's layer (the chain shared, its lineage starting there); a
//     release gives a managed root back as a plain directory holding its
//     live content. Layers belong to no root: mark-and-sweep keeps what
//     any checkpoint or live chain needs, so neither side of a clone can
//     break the other.
//   - Reads without a mount (view.go): a checkpoint's content is read
//     from its layer dirs as overlayfs would look it up (layerTree), the
//     live directory through its mount by handle (dirTree); Changes,
//     ReadEntry, Export and the copies of restore-paths and release
//     (materialize) use them. Against its parent, Changes walks only the
//     checkpoint's own layer. Reads of a live directory are best effort:
//     it is not frozen, so each entry is as it was when it was read.
//   - Crash safety: build where the metadata does not look, commit the
//     metadata, then make the mounts match it. Open recovers from every
//     crash point (finishes or undoes enrollments, clones and releases,
//     finishes half-done swaps, remounts every root), and a crash during
//     recovery is recovered by the next Open.
//   - Invariant: an upper layer is the upper of at most one writable
//     overlay superblock; every mount carries the store's source tag so
//     that the mount table says whose it is (CheckMounts, Check).
//
// Operations are named steps (steps.go): logged, timed, and failpoints
// for the crash tests. Errors are fault errors with stable codes; the
// HTTP mapping lives in internal/jsend, never here.
//
// What it does not do: decide which paths may be enrolled (pathpolicy),
// find the processes that hold a directory (holders), or speak HTTP
// (guestd).
package layers
