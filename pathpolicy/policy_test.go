package pathpolicy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"strata/internal/fault"
	"strata/internal/testenv"
)

// fakeMounts is the mount table the fake-tree tests pretend to have: the
// root filesystem, an attached disk, a bind mount, and a mount nested in a
// workspace directory.
var fakeMounts = []*mountinfo.Info{
	{Mountpoint: "/", Root: "/", FSType: "ext4"},
	{Mountpoint: "/proc", Root: "/", FSType: "proc"},
	{Mountpoint: "/mnt/s3", Root: "/", FSType: "fuse.s3"},
	{Mountpoint: "/workspace/bound", Root: "/data", FSType: "ext4"},
	{Mountpoint: "/workspace/nested/cache", Root: "/", FSType: "tmpfs"},
	{Mountpoint: "/workspace/nested/deeper/a", Root: "/", FSType: "tmpfs"},
}

// baseTree is the fake tree of the policy tests (Root of the Policy).
var baseTree = []node{
	mkdir("workspace/project/src/pkg"),
	file("workspace/project/README"),
	file("workspace/project/src/main.go"),
	symlink("workspace/project/src/link-to-etc", "/etc/passwd"), // links inside are fine
	symlink("workspace/project/dangling", "nowhere"),
	mkdir("workspace/empty"),
	symlink("workspace/linked", "project"),
	mkdir("workspace/realdir"),
	symlink("workspace/realdir/inner", "../project"),
	file("workspace/afile"),
	file("workspace/hardsrc"), // the other names are inside the checked trees
	file("workspace/hard/plain"),
	hardlink("workspace/hard/one", "workspace/hardsrc"),
	mkdir("workspace/deephard/a/b/c"),
	hardlink("workspace/deephard/a/b/c/x", "workspace/hardsrc"),
	file("workspace/hardpair/one"),
	hardlink("workspace/hardpair/two", "workspace/hardpair/one"),
	fifo("workspace/withfifo/sub/pipe"),
	socket("workspace/withsocket/s.sock"),
	mkdir("workspace/bound/x"),
	mkdir("workspace/nested/cache"),
	mkdir("workspace/nested/deeper/a"),
	mkdir("mnt/s3/bucket/dir"),
	mkdir("home/user/app"),
	mkdir("var/lib/strata"),
	mkdir("tmp/project"),
}

func newFakePolicy(t testing.TB) *Policy {
	t.Helper()
	root := t.TempDir()
	writeTree(t, root, baseTree)
	return &Policy{
		Root:           root,
		MountInfo:      func() ([]*mountinfo.Info, error) { return fakeMounts, nil },
		ExtraProtected: []string{"/var/lib/strata"},
	}
}

func TestCheckEnroll(t *testing.T) {
	p := newFakePolicy(t)
	managed := []string{"/home/user/app", "/workspace/empty"}
	tests := []struct {
		name      string
		path      string
		code      string // "" means accepted
		offending any
	}{
		{name: "plain project", path: "/workspace/project"},
		{name: "same path as a managed root", path: "/workspace/empty"},
		{name: "tmp descendant", path: "/tmp/project"},
		{name: "directory holding a symlink to a directory", path: "/workspace/realdir"},

		{name: "empty", path: "", code: CodeInvalidField},
		{name: "relative", path: "workspace/project", code: CodePathNotAbsolute},
		{name: "unclean", path: "/workspace/project/", code: CodePathNotClean},
		{name: "protected", path: "/etc", code: CodePathProtected, offending: "/etc"},
		{name: "extra protected store", path: "/var/lib/strata", code: CodePathProtected, offending: "/var/lib/strata"},

		{name: "child of a managed root", path: "/home/user/app/src", code: CodePathNested, offending: "/home/user/app"},
		{name: "parent of a managed root", path: "/home/user", code: CodePathNested, offending: "/home/user/app"},
		{name: "parent of a managed root, nonexistent child", path: "/home", code: CodePathNested, offending: "/home/user/app"},

		{name: "missing last component", path: "/workspace/nope", code: CodePathNotFound, offending: "/workspace/nope"},
		{name: "missing middle component", path: "/nope/a/b", code: CodePathNotFound, offending: "/nope"},
		// Found by FuzzCheckEnroll: ENAMETOOLONG was an internal error.
		{name: "component longer than NAME_MAX", path: "/workspace/" + strings.Repeat("x", 256) + "/y", code: CodePathNotFound, offending: "/workspace/" + strings.Repeat("x", 256)},

		{name: "symlink as last component", path: "/workspace/linked", code: CodePathSymlink, offending: "/workspace/linked"},
		{name: "symlink in the middle", path: "/workspace/linked/src", code: CodePathSymlink, offending: "/workspace/linked"},
		{name: "symlink below a real directory", path: "/workspace/realdir/inner", code: CodePathSymlink, offending: "/workspace/realdir/inner"},

		{name: "regular file", path: "/workspace/afile", code: CodePathNotDirectory, offending: "/workspace/afile"},
		{name: "file in the middle", path: "/workspace/afile/x", code: CodePathNotDirectory, offending: "/workspace/afile"},

		{name: "mount point itself", path: "/workspace/bound", code: CodePathMount, offending: "/workspace/bound"},
		{name: "inside a bind mount", path: "/workspace/bound/x", code: CodePathMount, offending: "/workspace/bound"},
		{name: "on an attached disk", path: "/mnt/s3/bucket", code: CodePathMount, offending: "/mnt/s3"},
		{name: "contains a mount", path: "/workspace/nested", code: CodePathMount, offending: "/workspace/nested/cache"},
		{name: "contains a deep mount", path: "/workspace/nested/deeper", code: CodePathMount, offending: "/workspace/nested/deeper/a"},

		{name: "hardlinked file", path: "/workspace/hard", code: CodePathHardlink, offending: "/workspace/hard/one"},
		{name: "hardlinked file deep down", path: "/workspace/deephard", code: CodePathHardlink, offending: "/workspace/deephard/a/b/c/x"},
		{name: "fifo", path: "/workspace/withfifo", code: CodePathSpecialFile, offending: "/workspace/withfifo/sub/pipe"},
		{name: "socket", path: "/workspace/withsocket", code: CodePathSpecialFile, offending: "/workspace/withsocket/s.sock"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.CheckEnroll(context.Background(), tt.path, managed)
			switch tt.code {
			case "":
				if err != nil {
					t.Fatalf("CheckEnroll(%q) = %v, want nil", tt.path, err)
				}
			case CodeInvalidField:
				wantFault(t, err, fault.Invalid, tt.code, map[string]any{"field": "path"})
			default:
				wantFault(t, err, fault.Unprocessable, tt.code, map[string]any{"path": tt.path, "offending": tt.offending})
			}
		})
	}
}

// TestCheckEnrollHardlinkOrder pins that either name of a hardlinked pair
// may be reported: both have nlink 2, and readdir order is the
// filesystem's.
func TestCheckEnrollHardlinkOrder(t *testing.T) {
	p := newFakePolicy(t)
	err := p.CheckEnroll(context.Background(), "/workspace/hardpair", nil)
	wantFault(t, err, fault.Unprocessable, CodePathHardlink, nil)
	o := fault.As(err).Fields["offending"]
	if o != "/workspace/hardpair/one" && o != "/workspace/hardpair/two" {
		t.Fatalf("offending = %v", o)
	}
}

func TestCheckEnrollDevices(t *testing.T) {
	testenv.RequiresRoot(t)
	p := newFakePolicy(t)
	writeTree(t, p.Root, []node{
		chardev("workspace/chr/null", unix.Mkdev(1, 3)),
		chardev("workspace/whiteout/w", 0),
		blockdev("workspace/blk/sda", unix.Mkdev(8, 0)),
	})
	for _, tc := range []struct{ path, offending string }{
		{"/workspace/chr", "/workspace/chr/null"},
		{"/workspace/whiteout", "/workspace/whiteout/w"}, // a whiteout outside an upper layer is a device like any other
		{"/workspace/blk", "/workspace/blk/sda"},
	} {
		err := p.CheckEnroll(context.Background(), tc.path, nil)
		wantFault(t, err, fault.Unprocessable, CodePathSpecialFile, map[string]any{"path": tc.path, "offending": tc.offending})
	}
}

func TestCheckEnrollAllowedMounts(t *testing.T) {
	p := newFakePolicy(t)
	p.AllowedMounts = []string{"/", "/mnt/s3"}
	if err := p.CheckEnroll(context.Background(), "/mnt/s3/bucket", nil); err != nil {
		t.Fatalf("with /mnt/s3 allowed: %v", err)
	}
	p.AllowedMounts = []string{"/tmp"}
	err := p.CheckEnroll(context.Background(), "/workspace/project", nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": "/"})
}

// TestCheckEnrollNoContainingMount pins that a mount table without any
// mount above the path (not this namespace's) is refused, not trusted.
func TestCheckEnrollNoContainingMount(t *testing.T) {
	p := newFakePolicy(t)
	p.MountInfo = func() ([]*mountinfo.Info, error) { return nil, nil }
	err := p.CheckEnroll(context.Background(), "/workspace/project", nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": "/workspace/project"})
}

func TestCheckEnrollMountTableError(t *testing.T) {
	p := newFakePolicy(t)
	boom := errors.New("boom")
	p.MountInfo = func() ([]*mountinfo.Info, error) { return nil, boom }
	err := p.CheckEnroll(context.Background(), "/workspace/project", nil)
	if !errors.Is(err, boom) || fault.As(err) != nil {
		t.Fatalf("err = %v, want the unclassified mount table error", err)
	}
}

func TestCheckEnrollCancelled(t *testing.T) {
	p := newFakePolicy(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.CheckEnroll(ctx, "/workspace/project", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestCheckNoMountsBelow(t *testing.T) {
	p := newFakePolicy(t)
	for _, tc := range []struct {
		path, offending string
	}{
		{"/workspace/project", ""},
		{"/workspace/bound", ""}, // being a mount point is fine for a managed root
		{"/workspace/nested", "/workspace/nested/cache"},
		{"/workspace", "/workspace/bound"},
		{"/mnt", "/mnt/s3"},
	} {
		err := p.CheckNoMountsBelow(tc.path)
		if tc.offending == "" {
			if err != nil {
				t.Errorf("CheckNoMountsBelow(%q) = %v", tc.path, err)
			}
			continue
		}
		wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"path": tc.path, "offending": tc.offending})
	}
}

// TestCheckEnrollRealMounts runs the mount rules against the live mount
// table of a private namespace, with real mounts.
func TestCheckEnrollRealMounts(t *testing.T) {
	testenv.RequiresRootMounts(t)
	base := t.TempDir()
	writeTree(t, base, []node{mkdir("holds/sub"), mkdir("mp/inside"), file("holds/f")})
	mount(t, "tmpfs", filepath.Join(base, "holds/sub"), "tmpfs", "")
	mount(t, "tmpfs", filepath.Join(base, "mp"), "tmpfs", "")
	if err := os.Mkdir(filepath.Join(base, "mp/inside"), 0o755); err != nil {
		t.Fatal(err)
	}
	var p Policy // the real root, the live mount table
	ctx := context.Background()

	err := p.CheckEnroll(ctx, filepath.Join(base, "holds"), nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": filepath.Join(base, "holds/sub")})
	err = p.CheckEnroll(ctx, filepath.Join(base, "mp"), nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": filepath.Join(base, "mp")})
	err = p.CheckEnroll(ctx, filepath.Join(base, "mp/inside"), nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": filepath.Join(base, "mp")})
	err = p.CheckNoMountsBelow(filepath.Join(base, "holds"))
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": filepath.Join(base, "holds/sub")})
	if err := p.CheckNoMountsBelow(filepath.Join(base, "mp")); err != nil {
		t.Fatalf("CheckNoMountsBelow(mount point) = %v", err)
	}

	// The walk itself refuses to cross a mount the table did not show yet.
	err = CheckTree(ctx, filepath.Join(base, "holds"), false, nil)
	wantFault(t, err, fault.Unprocessable, CodePathMount, map[string]any{"offending": filepath.Join(base, "holds/sub")})
}

// mount mounts and unmounts in t.Cleanup (lazily, so a leftover holder
// cannot fail the cleanup).
func mount(t testing.TB, source, target, fstype, data string) {
	t.Helper()
	if err := unix.Mount(source, target, fstype, 0, data); err != nil {
		t.Fatalf("mount %s on %s: %v", fstype, target, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL {
			t.Errorf("unmount %s: %v", target, err)
		}
	})
}

// FuzzCheckEnroll checks CheckEnroll's invariants on any path over the fake
// tree: it never panics, never escapes Root, refuses with a known code and
// the requested path, and accepts only directories the tree makes valid.
func FuzzCheckEnroll(f *testing.F) {
	for _, s := range []string{
		"/workspace/project", "/workspace/linked/src", "/workspace/hard", "/workspace/bound/x",
		"/workspace/nested", "/home/user", "/nope", "/workspace/afile/x", "/workspace/../../etc",
		"/workspace/withfifo", "/mnt/s3/bucket", "/workspace/project/src/link-to-etc",
	} {
		f.Add(s)
	}
	p := newFakePolicy(f)
	managed := []string{"/home/user/app"}
	valid := map[string]bool{}
	for _, v := range []string{
		"/workspace/project", "/workspace/project/src", "/workspace/project/src/pkg", "/workspace/empty",
		"/workspace/realdir", "/tmp/project", "/home/user/app",
	} {
		valid[v] = true
	}
	f.Fuzz(func(t *testing.T, path string) {
		err := p.CheckEnroll(context.Background(), path, managed)
		if err == nil {
			if !valid[path] {
				t.Fatalf("accepted %q", path)
			}
			return
		}
		fe := fault.As(err)
		if fe == nil {
			t.Fatalf("CheckEnroll(%q) = %v (%T), want *fault.Error", path, err, err)
		}
		switch {
		case fe.Code == CodeInvalidField:
			if fe.Kind != fault.Invalid {
				t.Fatalf("%+v", fe)
			}
		case slices.Contains(ViolationCodes, fe.Code):
			if fe.Kind != fault.Unprocessable || fe.Fields["path"] != path {
				t.Fatalf("violation %+v for %q", fe, path)
			}
			if o, ok := fe.Fields["offending"].(string); ok {
				if !strings.HasPrefix(o, "/") || strings.HasPrefix(o, p.Root) {
					t.Fatalf("offending %q for %q: not a path as requested", o, path)
				}
			}
		default:
			t.Fatalf("CheckEnroll(%q): unknown code %q", path, fe.Code)
		}
	})
}

// FuzzCheckNewPath checks CheckNewPath's invariants on any path over the
// fake tree: it never panics, refuses with a known code and the requested
// path, and accepts only a path that does not exist below a directory.
func FuzzCheckNewPath(f *testing.F) {
	for _, s := range []string{
		"/workspace/project", "/workspace/clone", "/workspace/project/new", "/workspace/linked/new",
		"/workspace/afile/x", "/home/user/app/x", "/home/new", "/nope/x", "/usr/x", "/workspace/bound/x",
	} {
		f.Add(s)
	}
	p := newFakePolicy(f)
	managed := []string{"/home/user/app"}
	f.Fuzz(func(t *testing.T, path string) {
		err := p.CheckNewPath(path, managed)
		if err == nil {
			var st unix.Stat_t
			if lerr := unix.Lstat(p.fsPath(path), &st); !errors.Is(lerr, unix.ENOENT) {
				t.Fatalf("accepted %q, which exists (%v)", path, lerr)
			}
			if lerr := unix.Stat(p.fsPath(filepath.Dir(path)), &st); lerr != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				t.Fatalf("accepted %q, whose parent is no directory (%v)", path, lerr)
			}
			return
		}
		fe := fault.As(err)
		switch {
		case fe == nil:
			t.Fatalf("CheckNewPath(%q) = %v (%T), want *fault.Error", path, err, err)
		case fe.Code == CodeInvalidField:
		case slices.Contains(ViolationCodes, fe.Code):
			if fe.Kind != fault.Unprocessable || fe.Fields["path"] != path {
				t.Fatalf("violation %+v for %q", fe, path)
			}
		default:
			t.Fatalf("CheckNewPath(%q): unknown code %q", path, fe.Code)
		}
	})
}
