package overlay

import (
	"path/filepath"
	"strconv"
	"strings"
)

// Options are the overlay options a Mounter sets on every mount, whatever
// the distribution's defaults. Two are fixed: no index (we enforce one
// mount per upper ourselves) and no metacopy (a copied-up file is whole in
// its layer). The third is chosen once, when a store opens (Probe).
type Options struct {
	// RedirectDir (redirect_dir=on) lets rename(2) move a directory that a
	// lower layer holds: the kernel copies the directory up without its
	// contents and records in its trusted.overlay.redirect xattr where the
	// lower layers hold it. Off (redirect_dir=off), that rename fails with
	// EXDEV and mv copies the directory instead.
	RedirectDir bool
}

// DefaultOptions are the options of a kernel that takes them all.
var DefaultOptions = Options{RedirectDir: true}

// pairs are the options as key/value pairs, in the order they are set.
func (o Options) pairs() [][2]string {
	redirect := "off"
	if o.RedirectDir {
		redirect = "on"
	}
	return [][2]string{{"index", "off"}, {"redirect_dir", redirect}, {"metacopy", "off"}}
}

// Stack is an overlay mount described as a value: which layer directories,
// in which order. Everything about a mount except the final syscalls is
// computed as a Stack and can be tested without root.
type Stack struct {
	// Layers is the store's layers directory; the other fields name
	// directories under it by layer id.
	Layers string
	// Upper is the active layer (read-write); 0 for a read-only stack.
	Upper uint64
	// Lowers are the read-only layers, topmost first.
	Lowers []uint64
	// Source is the mount's source tag (mountinfo's source field), which
	// tells whose mount it is; not part of the recorded stack.
	Source string `json:"-"`
}

// Dirs returns every layer id the stack uses, upper first.
func (s Stack) Dirs() []uint64 {
	out := make([]uint64, 0, len(s.Lowers)+1)
	if s.Upper != 0 {
		out = append(out, s.Upper)
	}
	return append(out, s.Lowers...)
}

// Equal reports whether two stacks use the same layers in the same order.
func (s Stack) Equal(o Stack) bool {
	if s.Upper != o.Upper || len(s.Lowers) != len(o.Lowers) {
		return false
	}
	for i := range s.Lowers {
		if s.Lowers[i] != o.Lowers[i] {
			return false
		}
	}
	return true
}

func LayerName(id uint64) string { return strconv.FormatUint(id, 10) }

// RelFS and RelWork are a layer's directories relative to the layers dir.
func RelFS(id uint64) string   { return LayerName(id) + "/fs" }
func RelWork(id uint64) string { return LayerName(id) + "/work" }

// FSDir is the absolute path of layer id's content directory.
func (s Stack) FSDir(id uint64) string { return filepath.Join(s.Layers, RelFS(id)) }

// WorkDir is the absolute path of layer id's overlay work directory.
func (s Stack) WorkDir(id uint64) string { return filepath.Join(s.Layers, RelWork(id)) }

// Config is the stack as fsconfig key/value pairs with absolute paths, one
// "lowerdir+" per layer (kernel 6.8+), then the options o, in the order
// they must be applied.
func (s Stack) Config(o Options) [][2]string {
	kv := make([][2]string, 0, len(s.Lowers)+5)
	for _, l := range s.Lowers {
		kv = append(kv, [2]string{"lowerdir+", s.FSDir(l)})
	}
	if s.Upper != 0 {
		kv = append(kv, [2]string{"upperdir", s.FSDir(s.Upper)}, [2]string{"workdir", s.WorkDir(s.Upper)})
	}
	if s.Source != "" {
		kv = append(kv, [2]string{"source", s.Source})
	}
	return append(kv, o.pairs()...)
}

// LegacySource is the source argument of mount(2) for the stack.
func (s Stack) LegacySource() string {
	if s.Source == "" {
		return "overlay"
	}
	return s.Source
}

// LegacyData is the stack and the options o as a mount(2) option string
// with paths relative to the layers directory: the caller mounts from a
// thread whose working directory is Layers, so that deep stacks fit in one
// page.
func (s Stack) LegacyData(o Options) string {
	var b strings.Builder
	b.WriteString("lowerdir=")
	for i, l := range s.Lowers {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(RelFS(l))
	}
	if s.Upper != 0 {
		b.WriteString(",upperdir=" + RelFS(s.Upper) + ",workdir=" + RelWork(s.Upper))
	}
	for _, kv := range o.pairs() {
		b.WriteString("," + kv[0] + "=" + kv[1])
	}
	return b.String()
}

// ParseOptions extracts the layer directories of a mounted overlay
// from its super options as mountinfo shows them: "lowerdir+=" entries (new
// mount API), or one colon-joined "lowerdir=" (mount(2), possibly relative
// to the layers dir), and "upperdir=". Escaped colons and commas do not
// occur in our own layer paths, so they are not unescaped.
func ParseOptions(opts, layersDir string) (upper string, lowers []string) {
	abs := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(layersDir, p)
	}
	for _, o := range strings.Split(opts, ",") {
		k, v, ok := strings.Cut(o, "=")
		if !ok {
			continue
		}
		switch k {
		case "lowerdir+":
			lowers = append(lowers, abs(v))
		case "lowerdir":
			for _, l := range strings.Split(v, ":") {
				if l != "" {
					lowers = append(lowers, abs(l))
				}
			}
		case "upperdir":
			upper = abs(v)
		}
	}
	return upper, lowers
}

// Matches reports whether a mounted overlay's options describe s.
func (s Stack) Matches(opts string) bool {
	upper, lowers := ParseOptions(opts, s.Layers)
	want := ""
	if s.Upper != 0 {
		want = s.FSDir(s.Upper)
	}
	if upper != want || len(lowers) != len(s.Lowers) {
		return false
	}
	for i, l := range s.Lowers {
		if lowers[i] != s.FSDir(l) {
			return false
		}
	}
	return true
}
