// Package overlay computes overlayfs mounts as values and makes the
// syscalls that apply them.
//
// A Stack names a mount's layer directories (an upper and its lowers, by
// layer id under a store's layers directory) and computes everything
// about the mount without root: the fsconfig key/value pairs of the new
// mount API (one "lowerdir+" per layer, kernel 6.8+), the mount(2) option
// string with relative names (kernels without it; the string is cut
// silently at one page), and whether a mounted overlay's options describe
// it (Matches, ParseOptions).
//
// A Mounter applies stacks: FSMounter builds a detached mount (fsopen,
// fsconfig, fsmount) and slides it beneath the live one with
// move_mount(MOVE_MOUNT_BENEATH), so the directory is never empty;
// LegacyMounter unmounts and mounts with mount(2). Every mount of a
// Mounter carries its Options: index=off, metacopy=off, and redirect_dir=on
// so that a directory a lower layer holds can be renamed (the kernel
// records a redirect in the upper layer; readers of layers must follow
// it). Probe picks the best Mounter the kernel has by mounting a tiny
// stack and renaming a directory in it; a kernel that refuses
// redirect_dir=on gets one with redirect_dir=off. Both Mounters take a
// Target (a directory fd and an entry name) rather than a path, so that a
// rename between a check and a mount cannot redirect it; Freeze, Thaw and
// UnmountTop do the same. The same conformance suite (package layers'
// store tests) runs against both.
//
// What it does not do: decide which stack a directory should have, or
// keep any state: that is package layers.
package overlay
