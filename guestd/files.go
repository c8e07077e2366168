package guestd

import (
	"archive/tar"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"strata/internal/api"
	"strata/internal/httpx"
	"strata/internal/jsend"
	"strata/internal/treetar"
)

// Files in and out of the guest (/v1/files/{path…}): a file's bytes, a
// directory's listing or its tar, an upload of a file or of a tar into a
// directory, a removal. Bodies are copied through a buffer of
// fileBuffer bytes, never held whole. guestd is root in its guest, as the
// sandbox's own user is: these routes reach what exec reaches, no more.
//
// An upload of a file is written beside its target and renamed over it
// once whole and on disk: a reader sees the old file or the new one. A
// tar is unpacked through an os.Root of its directory, so no entry, and
// no symlink an earlier entry made, takes a write outside it.

const fileBuffer = 32 << 10

// guestPath is the route's {path…} as an absolute path in the guest.
func guestPath(r *http.Request) (string, error) {
	p, err := api.ParseEntryPath(r.PathValue("path"))
	if err != nil {
		return "", err
	}
	return "/" + p, nil
}

// fileError turns a filesystem error into the API's: a missing path
// file_not_found, a full disk insufficient_storage.
func fileError(p string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return api.ErrFileNotFound.With("path", p)
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return api.ErrGuestDiskFull.With("path", p)
	case errors.Is(err, syscall.EISDIR):
		return api.ErrNotAFile.With("path", p)
	}
	return err
}

// files serves /v1/files and /v1/files/{path…}.
func (s *Server) files(w http.ResponseWriter, r *http.Request) {
	// A file may take longer to send than the server's read timeout.
	http.NewResponseController(w).SetReadDeadline(time.Time{})
	p, err := guestPath(r)
	if err == nil {
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			err = s.getFile(w, r, p)
		case http.MethodPut:
			var res api.FileWritten
			if res, err = putFile(r, p); err == nil {
				httpx.Respond(w, r, res, nil)
				return
			}
		case http.MethodDelete:
			if err = deleteFile(r, p); err == nil {
				httpx.Respond(w, r, map[string]any{}, nil)
				return
			}
		default:
			w.Header().Set("Allow", "DELETE, GET, HEAD, PUT")
			err = httpx.ErrMethodNotAllowed
		}
	}
	if err != nil {
		httpx.WriteError(w, r, err)
	}
}

// getFile answers a file's bytes (ranges allowed), or a directory's tar
// (Accept: application/x-tar) or listing.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fileError(p, err)
	}
	if fi.IsDir() {
		if strings.Contains(r.Header.Get("Accept"), api.MediaTar) {
			w.Header().Set("Content-Type", api.MediaTar)
			tw := tar.NewWriter(w)
			err := treetar.Write(tw, p)
			if err == nil {
				err = tw.Close()
			}
			if err != nil {
				// The answer has begun: it is broken off, so that the
				// client never takes a short tar for the whole tree.
				s.log.Warn("files: the tar of a directory was cut", "path", p, "err", err)
				panic(http.ErrAbortHandler)
			}
			return nil
		}
		list, err := listDir(p)
		if err != nil {
			return fileError(p, err)
		}
		httpx.Respond(w, r, list, nil)
		return nil
	}
	if !fi.Mode().IsRegular() {
		return api.ErrNotAFile.With("path", p)
	}
	f, err := os.Open(p)
	if err != nil {
		return fileError(p, err)
	}
	defer f.Close()
	w.Header().Set("Content-Type", api.MediaOctetStream)
	w.Header().Set(api.HeaderFileMode, api.FormatFileMode(uint32(fi.Mode().Perm()|fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))))
	w.Header().Set(api.HeaderFileMtime, fi.ModTime().UTC().Format(time.RFC3339Nano))
	http.ServeContent(w, r, "", fi.ModTime(), f)
	return nil
}

func entryType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

func listDir(p string) (api.FileListing, error) {
	des, err := os.ReadDir(p)
	if err != nil {
		return api.FileListing{}, err
	}
	out := api.FileListing{Path: p, Entries: make([]api.FileEntry, 0, len(des))}
	for _, de := range des {
		fi, err := de.Info()
		if err != nil {
			continue // gone meanwhile
		}
		e := api.FileEntry{Name: de.Name(), Type: entryType(fi.Mode()), SizeBytes: fi.Size(), Mode: api.FormatFileMode(uint32(fi.Mode().Perm())), Mtime: fi.ModTime().UTC()}
		if e.Type == "symlink" {
			e.Target, _ = os.Readlink(filepath.Join(p, de.Name()))
		}
		out.Entries = append(out.Entries, e)
	}
	return out, nil
}

// putFile writes the body to p (a file), or unpacks it into p (a
// directory) when it is a tar.
func putFile(r *http.Request, p string) (api.FileWritten, error) {
	parents := false
	for k, v := range r.URL.Query() {
		if k != "parents" || len(v) != 1 || (v[0] != "true" && v[0] != "false") {
			return api.FileWritten{}, jsend.InvalidField(k, "the only query parameter is parents=true")
		}
		parents = v[0] == "true"
	}
	mode, err := api.ParseFileMode(r.Header.Get(api.HeaderFileMode), 0o644)
	if err != nil {
		return api.FileWritten{}, err
	}
	mtime, err := api.ParseFileMtime(r.Header.Get(api.HeaderFileMtime))
	if err != nil {
		return api.FileWritten{}, err
	}
	ct := r.Header.Get("Content-Type")
	switch ct {
	case api.MediaOctetStream, "":
	case api.MediaTar:
		n, err := untar(r.Body, p, parents)
		return api.FileWritten{Path: p, SizeBytes: n}, err
	default:
		return api.FileWritten{}, jsend.InvalidField("Content-Type", "Content-Type must be application/octet-stream (a file) or application/x-tar (a directory)")
	}
	if p == "/" {
		return api.FileWritten{}, api.ErrNotAFile.With("path", p)
	}
	dir, name := path.Split(p)
	if parents {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return api.FileWritten{}, fileError(dir, err)
		}
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return api.FileWritten{}, fileError(dir, err)
	}
	defer root.Close()
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return api.FileWritten{}, api.ErrNotAFile.With("path", p)
	}
	tmp := "." + name + ".strata-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return api.FileWritten{}, fileError(p, err)
	}
	done := false
	defer func() {
		if !done {
			f.Close()
			root.Remove(tmp)
		}
	}()
	n, err := io.CopyBuffer(f, r.Body, make([]byte, fileBuffer))
	if err == nil {
		err = f.Chmod(fs.FileMode(mode&0o777) | modeBits(mode))
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Close()
		done = err == nil
		if !done {
			root.Remove(tmp)
			done = true
		}
	}
	if err == nil && !mtime.IsZero() {
		err = root.Chtimes(tmp, mtime, mtime)
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
		return api.FileWritten{}, fileError(p, err)
	}
	return api.FileWritten{Path: p, SizeBytes: n}, nil
}

// modeBits are the setuid, setgid and sticky bits of an octal mode, as
// fs.FileMode has them.
func modeBits(mode uint32) fs.FileMode {
	var m fs.FileMode
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// untar unpacks a tar into directory dir (made, with its parents when
// parents), through an os.Root of it (treetar.Extract); it returns the
// bytes of the files written. An entry that would land outside dir is
// invalid_field.
func untar(body io.Reader, dir string, parents bool) (int64, error) {
	if parents {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, fileError(dir, err)
		}
	} else if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, fileError(dir, err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fileError(dir, err)
	}
	defer root.Close()
	n, err := treetar.Extract(body, root, treetar.KeepAll)
	var outside *treetar.OutsideError
	var entry *treetar.EntryError
	switch {
	case err == nil:
		return n, nil
	case errors.As(err, &outside):
		return n, jsend.InvalidField("body", err.Error())
	case errors.Is(err, treetar.ErrNotTar):
		return n, jsend.InvalidField("body", "the body is not a tar: "+err.Error())
	case errors.As(err, &entry):
		if errors.Is(err, fs.ErrPermission) || strings.Contains(err.Error(), "path escapes") {
			return n, jsend.InvalidField("body", err.Error())
		}
		return n, fileError(path.Join(dir, entry.Name), entry.Err)
	}
	return n, err
}

// deleteFile removes a file or an empty directory; with recursive=true a
// whole tree. The root directory is never removed.
func deleteFile(r *http.Request, p string) error {
	recursive := false
	for k, v := range r.URL.Query() {
		if k != "recursive" || len(v) != 1 || (v[0] != "true" && v[0] != "false") {
			return jsend.InvalidField(k, "the only query parameter is recursive=true")
		}
		recursive = v[0] == "true"
	}
	if p == "/" {
		return jsend.InvalidField("path", "the root directory is not removed")
	}
	if _, err := os.Lstat(p); err != nil {
		return fileError(p, err)
	}
	var err error
	if recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		return api.ErrDirectoryNotEmpty.With("path", p)
	}
	if err != nil {
		return fileError(p, err)
	}
	return nil
}
