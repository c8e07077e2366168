package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The Python SDK in every guest: the pure-Python package strata
// (sdk/python/strata) goes into the initramfs under InitramfsPythonDir,
// and strata-init copies it to the guest's /run and links it into the
// system Python's dist-packages (guestinit.PythonLinks), so that a program
// inside a sandbox imports the SDK of the image it booted, with nothing
// installed on its disk.

// InitramfsPythonDir is where the package's files are in the initramfs:
// InitramfsPythonDir/strata/….
const InitramfsPythonDir = "python"

// pyFile is one file of the Python package: its path relative to the
// package's directory (slash-separated) and where it is on the host.
type pyFile struct {
	rel, src string
}

// pythonPackage lists the package in dir (its .py files and py.typed,
// caches left out) and returns them sorted with a digest of their names
// and contents, for the image's key. A symlink or a special file in it is
// an error: what goes into the image is exactly what the digest covers.
func pythonPackage(dir string) ([]pyFile, string, error) {
	var files []pyFile
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir() && d.Name() == "__pycache__":
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case !d.Type().IsRegular():
			return fmt.Errorf("python package %s: %s is not a regular file", dir, rel)
		case strings.HasSuffix(d.Name(), ".py") || d.Name() == "py.typed":
			files = append(files, pyFile{rel: filepath.ToSlash(rel), src: p})
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	if !slices.ContainsFunc(files, func(f pyFile) bool { return f.rel == "__init__.py" }) {
		return nil, "", fmt.Errorf("python package %s has no __init__.py", dir)
	}
	slices.SortFunc(files, func(a, b pyFile) int { return strings.Compare(a.rel, b.rel) })
	h := sha256.New()
	for _, f := range files {
		sum, err := fileSHA256(f.src)
		if err != nil {
			return nil, "", err
		}
		fmt.Fprintf(h, "%s\x00%s\n", f.rel, sum)
	}
	return files, hex.EncodeToString(h.Sum(nil)), nil
}

// pythonDirs are the directories under InitramfsPythonDir/strata that
// files need, parents first.
func pythonDirs(files []pyFile) []string {
	seen := map[string]bool{}
	var dirs []string
	for _, f := range files {
		var chain []string
		for d := path.Dir(f.rel); d != "." && !seen[d]; d = path.Dir(d) {
			seen[d] = true
			chain = append(chain, d)
		}
		slices.Reverse(chain)
		dirs = append(dirs, chain...)
	}
	return dirs
}

// prefixAll is each of ss with prefix before it.
func prefixAll(prefix string, ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = prefix + s
	}
	return out
}
