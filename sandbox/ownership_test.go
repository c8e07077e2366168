package sandbox

import (
	"os"
	"strings"
	"testing"
)

// TestCheckOwnership: the directories from Dir up to / must be root's (or
// hostproxy's own uid's) and not writable by group or others; only a
// sticky parent may be writable by all. Regression: New checked only that
// they were traversable, so a Dir below a directory another uid could
// write let that uid swap <dir>/<id>/ctl.
func TestCheckOwnership(t *testing.T) {
	const self = 1000
	d := func(path string, uid uint32, mode os.FileMode) dirInfo {
		return dirInfo{Path: path, Uid: uid, Mode: mode}
	}
	root := d("/", 0, os.ModeDir|0o755)
	tmp := d("/tmp", 0, os.ModeDir|os.ModeSticky|0o777)
	for _, c := range []struct {
		name  string
		chain []dirInfo
		want  string // in the error; "" for none
	}{
		{"production", []dirInfo{d("/var/lib/strata/vms", 0, os.ModeDir|0o711), d("/var/lib/strata", 0, os.ModeDir|0o755), d("/var/lib", 0, os.ModeDir|0o755), d("/var", 0, os.ModeDir|0o755), root}, ""},
		{"the tests' stacks under /tmp", []dirInfo{d("/tmp/sbx1/sb", 0, os.ModeDir|0o711), d("/tmp/sbx1", 0, os.ModeDir|0o711), tmp, root}, ""},
		{"hostproxy's own uid", []dirInfo{d("/home/u/vms", self, os.ModeDir|0o711), d("/home/u", self, os.ModeDir|0o755), d("/home", 0, os.ModeDir|0o755), root}, ""},
		{"Dir of another uid", []dirInfo{d("/srv/vms", 2000, os.ModeDir|0o711), d("/srv", 0, os.ModeDir|0o755), root}, "/srv/vms is owned by uid 2000"},
		{"a parent of another uid", []dirInfo{d("/srv/x/vms", 0, os.ModeDir|0o711), d("/srv/x", 200001, os.ModeDir|0o755), d("/srv", 0, os.ModeDir|0o755), root}, "/srv/x is owned by uid 200001"},
		{"Dir group-writable", []dirInfo{d("/srv/vms", 0, os.ModeDir|0o771), d("/srv", 0, os.ModeDir|0o755), root}, "/srv/vms is writable"},
		{"a parent other-writable", []dirInfo{d("/srv/x/vms", 0, os.ModeDir|0o711), d("/srv/x", 0, os.ModeDir|0o757), d("/srv", 0, os.ModeDir|0o755), root}, "/srv/x is writable"},
		{"Dir sticky and writable by all", []dirInfo{d("/srv/vms", 0, os.ModeDir|os.ModeSticky|0o777), d("/srv", 0, os.ModeDir|0o755), root}, "/srv/vms is writable"},
		{"a sticky parent of another uid", []dirInfo{d("/srv/x/vms", 0, os.ModeDir|0o711), d("/srv/x", 2000, os.ModeDir|os.ModeSticky|0o777), root}, "/srv/x is owned by uid 2000"},
		{"directly under /tmp", []dirInfo{d("/tmp/vms", 0, os.ModeDir|0o711), tmp, root}, ""},
	} {
		err := checkOwnership(c.chain, self)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// FuzzCheckOwnership: whatever the chain, an accepted one has every
// directory root's or self's, and none writable by group or others but
// a sticky parent.
func FuzzCheckOwnership(f *testing.F) {
	f.Add(uint32(0), uint32(0o711), uint32(0), uint32(0o1777), uint32(0), uint32(0o755))
	f.Add(uint32(7), uint32(0o777), uint32(0), uint32(0o1777), uint32(1000), uint32(0o700))
	f.Fuzz(func(t *testing.T, u0, m0, u1, m1, u2, m2 uint32) {
		mode := func(m uint32) os.FileMode {
			fm := os.ModeDir | os.FileMode(m&0o777)
			if m&0o1000 != 0 {
				fm |= os.ModeSticky
			}
			return fm
		}
		chain := []dirInfo{{"/a/b/c", u0, mode(m0)}, {"/a/b", u1, mode(m1)}, {"/a", u2, mode(m2)}, {"/", 0, os.ModeDir | 0o755}}
		if checkOwnership(chain, 1000) != nil {
			return
		}
		for i, d := range chain {
			if d.Uid != 0 && d.Uid != 1000 {
				t.Fatalf("accepted %+v owned by %d", d, d.Uid)
			}
			if d.Mode.Perm()&0o022 != 0 && (i == 0 || d.Mode&os.ModeSticky == 0) {
				t.Fatalf("accepted %+v writable by others", d)
			}
		}
	})
}
