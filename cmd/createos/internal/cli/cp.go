package cli

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"strata/client"
	"strata/internal/api"
	"strata/internal/treetar"
)

// Files in and out of a sandbox (api's files routes), streamed: a file of
// any size costs createos one buffer.

// splitRemote splits "SANDBOX:/path"; ok false for a local path.
func splitRemote(s string) (sandbox, p string, ok bool) {
	sb, p, found := strings.Cut(s, ":")
	if !found || sb == "" || !strings.HasPrefix(p, "/") || strings.Contains(sb, "/") {
		return "", "", false
	}
	return sb, path.Clean(p), true
}

func (a *app) cpCommand() *cobra.Command {
	var parents bool
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories into or out of a sandbox",
		Long: `Copy a file or a directory between here and a running sandbox. One side is
written SANDBOX:/absolute/path, the other is a local path, or - for
standard input or output. A file keeps its mode and modification time; a
directory goes as a tar stream (modes, times and symlinks kept) and lands,
as with cp -r, inside DST when DST is an existing directory, else as DST.
Out of a sandbox, modes lose what your umask clears, and never carry
setuid, setgid or sticky.
Nothing is held whole in memory on either side: files of any size, up to
the space on the receiving side.

  - as SRC is one file's bytes; - as DST writes a file's bytes, or a
directory's tar, to standard output.`,
		Example: "  createos sandbox cp ./app.tar.gz sb-local:/workspace/\n" +
			"  createos sandbox cp ./src sb-local:/workspace/src\n" +
			"  createos sandbox cp sb-local:/workspace/out.log .\n" +
			"  createos sandbox cp sb-local:/workspace - | tar -t",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			srcSB, srcPath, srcRemote := splitRemote(args[0])
			dstSB, dstPath, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return errors.New("one of SRC and DST must be SANDBOX:/path, the other a local path or -")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if dstRemote {
				return wrap(a.upload(cmd.Context(), c, args[0], dstSB, dstPath, parents))
			}
			return wrap(a.download(cmd.Context(), c, srcSB, srcPath, args[1]))
		},
	}
	cmd.Flags().BoolVar(&parents, "parents", false, "make the sandbox-side parent directories that are missing")
	return cmd
}

// upload copies local src (a file, a directory, or - for stdin) to guest
// path dst.
func (a *app) upload(ctx context.Context, c *Client, src, sandbox, dst string, parents bool) error {
	q := ""
	if parents {
		q = "?parents=true"
	}
	if src == "-" {
		h := http.Header{"Content-Type": {api.MediaOctetStream}}
		resp, err := c.Stream(ctx, http.MethodPut, client.FilesPath(sandbox, dst)+q, h, io.NopCloser(stdin), -1)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	kind, err := c.Stat(ctx, sandbox, dst)
	if err != nil {
		return err
	}
	if kind == "dir" {
		dst = path.Join(dst, filepath.Base(filepath.Clean(src)))
	}
	if fi.IsDir() {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeLocalTar(pw, src)) }()
		h := http.Header{"Content-Type": {api.MediaTar}}
		resp, err := c.Stream(ctx, http.MethodPut, client.FilesPath(sandbox, dst)+q, h, pr, -1)
		pr.CloseWithError(errors.New("upload ended"))
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	h := http.Header{
		"Content-Type":      {api.MediaOctetStream},
		api.HeaderFileMode:  {api.FormatFileMode(uint32(fi.Mode().Perm()))},
		api.HeaderFileMtime: {fi.ModTime().UTC().Format(time.RFC3339Nano)},
	}
	resp, err := c.Stream(ctx, http.MethodPut, client.FilesPath(sandbox, dst)+q, h, f, fi.Size())
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// download copies guest path src to local dst (- for stdout). Modes are
// the sandbox's less this process's umask, never setuid, setgid or
// sticky (treetar.LocalModes): what cp and tar give a user.
func (a *app) download(ctx context.Context, c *Client, sandbox, src, dst string) error {
	kind, err := c.Stat(ctx, sandbox, src)
	if err != nil {
		return err
	}
	if kind == "" {
		return &APIError{Status: http.StatusNotFound, Code: api.CodeFileNotFound, Message: "no file or directory has this path in the sandbox", Fields: map[string]json.RawMessage{"path": json.RawMessage(strconv.Quote(src))}}
	}
	h := http.Header{}
	if kind == "dir" {
		h.Set("Accept", api.MediaTar)
	}
	resp, err := c.Stream(ctx, http.MethodGet, client.FilesPath(sandbox, src), h, nil, 0)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if dst == "-" {
		_, err := io.CopyBuffer(a.stdout, resp.Body, make([]byte, 32<<10))
		return err
	}
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	keep := treetar.LocalModes(umask())
	if kind == "dir" {
		return readLocalTar(resp.Body, dst, keep)
	}
	mode, _ := api.ParseFileMode(resp.Header.Get(api.HeaderFileMode), 0o644)
	perm := fs.FileMode(mode&0o777) & keep
	tmp := dst + ".createos-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.CopyBuffer(f, resp.Body, make([]byte, 32<<10))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if t, perr := api.ParseFileMtime(resp.Header.Get(api.HeaderFileMtime)); err == nil && perr == nil && !t.IsZero() {
		err = os.Chtimes(tmp, t, t)
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// writeLocalTar writes the tree under dir.
func writeLocalTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	if err := treetar.Write(tw, dir); err != nil {
		return err
	}
	return tw.Close()
}

// readLocalTar unpacks a tar from a sandbox into dir (made), through an
// os.Root of it: no entry lands outside it; of each entry's mode only
// keep's bits are set.
func readLocalTar(r io.Reader, dir string, keep fs.FileMode) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	_, err = treetar.Extract(r, root, keep)
	return err
}
