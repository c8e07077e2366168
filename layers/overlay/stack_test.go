package overlay

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestStackConfig(t *testing.T) {
	s := Stack{Layers: "/s/layers", Upper: 9, Lowers: []uint64{7, 3, 1}}
	layers := [][2]string{
		{"lowerdir+", "/s/layers/7/fs"}, {"lowerdir+", "/s/layers/3/fs"}, {"lowerdir+", "/s/layers/1/fs"},
		{"upperdir", "/s/layers/9/fs"}, {"workdir", "/s/layers/9/work"},
	}
	tests := []struct {
		name   string
		opts   Options
		config [][2]string
		legacy string
	}{
		{
			name:   "redirect_dir on",
			opts:   DefaultOptions,
			config: append(slices.Clone(layers), [2]string{"index", "off"}, [2]string{"redirect_dir", "on"}, [2]string{"metacopy", "off"}),
			legacy: "lowerdir=7/fs:3/fs:1/fs,upperdir=9/fs,workdir=9/work,index=off,redirect_dir=on,metacopy=off",
		},
		{
			name:   "redirect_dir off (a kernel that refuses on)",
			opts:   Options{RedirectDir: false},
			config: append(slices.Clone(layers), [2]string{"index", "off"}, [2]string{"redirect_dir", "off"}, [2]string{"metacopy", "off"}),
			legacy: "lowerdir=7/fs:3/fs:1/fs,upperdir=9/fs,workdir=9/work,index=off,redirect_dir=off,metacopy=off",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Config(tc.opts); !slices.Equal(got, tc.config) {
				t.Errorf("Config() = %v, want %v", got, tc.config)
			}
			if d := s.LegacyData(tc.opts); d != tc.legacy {
				t.Errorf("LegacyData() = %q, want %q", d, tc.legacy)
			}
		})
	}
	if dirs := s.Dirs(); len(dirs) != 4 || dirs[0] != 9 || dirs[3] != 1 {
		t.Errorf("Dirs() = %v", dirs)
	}
}

// TestMounterOptions pins that the exported mounters mount with
// redirect_dir=on: a store that probed otherwise makes its own.
func TestMounterOptions(t *testing.T) {
	for _, m := range []Mounter{FSMounter(), LegacyMounter()} {
		if m.Options() != DefaultOptions || !m.Options().RedirectDir {
			t.Errorf("%s: options %+v, want %+v", m.Name(), m.Options(), DefaultOptions)
		}
	}
}

func TestStackMatches(t *testing.T) {
	s := Stack{Layers: "/s/layers", Upper: 9, Lowers: []uint64{7, 3}}
	tests := []struct {
		name string
		opts string
		want bool
	}{
		{"new mount API", "rw,lowerdir+=/s/layers/7/fs,lowerdir+=/s/layers/3/fs,upperdir=/s/layers/9/fs,workdir=/s/layers/9/work,uuid=on", true},
		{"mount(2) relative", "rw,lowerdir=7/fs:3/fs,upperdir=9/fs,workdir=9/work", true},
		{"frozen", "ro,lowerdir+=/s/layers/7/fs,lowerdir+=/s/layers/3/fs,upperdir=/s/layers/9/fs,workdir=/s/layers/9/work", true},
		{"other upper", "rw,lowerdir+=/s/layers/7/fs,lowerdir+=/s/layers/3/fs,upperdir=/s/layers/8/fs", false},
		{"missing lower", "rw,lowerdir+=/s/layers/7/fs,upperdir=/s/layers/9/fs", false},
		{"lowers reordered", "rw,lowerdir=3/fs:7/fs,upperdir=9/fs", false},
		{"other store", "rw,lowerdir+=/t/layers/7/fs,lowerdir+=/t/layers/3/fs,upperdir=/t/layers/9/fs", false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Matches(tc.opts); got != tc.want {
				t.Errorf("Matches(%q) = %v, want %v", tc.opts, got, tc.want)
			}
		})
	}
}

// TestLegacyDataDepth pins the reason for relative names: 300 layers with
// six-digit ids fit mount(2)'s one-page option string, and a stack that
// does not fit is refused before any syscall instead of being cut short.
func TestLegacyDataDepth(t *testing.T) {
	s := Stack{Layers: "/var/lib/strata/layers", Upper: 999999}
	for i := 0; i < 300; i++ {
		s.Lowers = append(s.Lowers, uint64(100000+i))
	}
	if d := s.LegacyData(DefaultOptions); len(d) >= 4096 {
		t.Fatalf("300 lowers need %d bytes", len(d))
	}
	for i := 0; i < 200; i++ {
		s.Lowers = append(s.Lowers, uint64(200000+i))
	}
	err := legacyMounter{}.Mount(context.Background(), Target{Dir: -1, Name: "nonexistent"}, s)
	if err == nil || !strings.Contains(err.Error(), "exceed one page") {
		t.Fatalf("Mount of a 500-layer stack with long names: %v, want a refusal", err)
	}
}

func FuzzParseOverlayOptions(f *testing.F) {
	f.Add("rw,lowerdir+=/a/1/fs,upperdir=/a/2/fs", "/a")
	f.Add("lowerdir=1/fs:2/fs,upperdir=3/fs", "/a")
	f.Fuzz(func(t *testing.T, opts, layers string) {
		upper, lowers := ParseOptions(opts, "/store/layers")
		for _, l := range append(lowers, upper) {
			if l != "" && !strings.HasPrefix(l, "/") {
				t.Fatalf("relative layer %q from %q", l, opts)
			}
		}
	})
}
