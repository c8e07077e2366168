package pathpolicy

import (
	"path/filepath"
	"strings"
)

// exactProtected are refused themselves; their descendants are fine
// (/tmp/project and /var/tmp/project are valid managed roots).
var exactProtected = []string{"/", "/tmp", "/var/tmp"}

// Protected are the trees of the seed document that are refused together
// with their descendants and their ancestors: system trees, platform
// filesystem trees and container storage.
var Protected = []string{
	"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot",
	"/dev", "/proc", "/sys", "/run", "/lost+found",
	"/.fc-overlay", "/overlay", "/lower", "/merged", "/oldroot",
	"/var/lib/docker", "/var/lib/containerd", "/var/lib/rancher",
}

// CheckSyntax checks the path string alone, without touching the
// filesystem: it is non-empty, at most MaxPathLen bytes, free of NUL bytes,
// absolute, clean (filepath.Clean(p) == p) and not protected. extraProtected
// trees (guestd's own stores) are protected like Protected: the tree, its
// descendants and its ancestors.
func CheckSyntax(p string, extraProtected []string) error {
	switch {
	case p == "":
		return invalidPath("The path is empty.")
	case len(p) > MaxPathLen:
		return invalidPath("The path is longer than 4096 bytes.")
	case strings.IndexByte(p, 0) >= 0:
		return invalidPath("The path contains a NUL byte.")
	case p[0] != '/':
		return violation(CodePathNotAbsolute, p, "", "The path must be absolute.")
	case filepath.Clean(p) != p:
		return violation(CodePathNotClean, p, "",
			"The path must be clean: no trailing slash, no repeated slash, no . or .. component.")
	}
	if t := protectedBy(p, extraProtected); t != "" {
		return violation(CodePathProtected, p, t,
			"The path is, contains or lies inside a protected system tree.")
	}
	return nil
}

// protectedBy returns the protected tree that p conflicts with, or "". p
// must be absolute and clean.
func protectedBy(p string, extra []string) string {
	for _, t := range exactProtected {
		if p == t {
			return t
		}
	}
	for _, t := range Protected {
		if related(p, t) {
			return t
		}
	}
	for _, t := range extra {
		if t == "" {
			continue
		}
		// Make a sloppy entry absolute and clean rather than ignore it: a
		// store left unprotected is worse than one protected too widely.
		t = filepath.Clean("/" + t)
		if related(p, t) {
			return t
		}
	}
	return ""
}

// related reports whether a and b are the same path or one is an ancestor
// of the other. Both must be absolute and clean.
func related(a, b string) bool {
	return a == b || under(a, b) || under(b, a)
}

// under reports whether p lies strictly below dir. Both must be absolute and
// clean; "/" is above every other path.
func under(p, dir string) bool {
	if dir == "/" {
		return p != "/" && strings.HasPrefix(p, "/")
	}
	return len(p) > len(dir) && p[len(dir)] == '/' && strings.HasPrefix(p, dir)
}
