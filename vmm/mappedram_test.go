package vmm

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// testBlock is a RAM block of a synthetic mapped-ram state.
type testBlock struct {
	name string
	used int64
}

// mappedState lays blocks out as QEMU 10 does after strata's header (the
// layout this file's parser reads, checked against a real state in
// TestForkMapsState), and returns the bytes up to the last block's pages,
// which are left out (holes): the caller pads or cuts. mangle, when not
// nil, changes a block's header fields before they are written.
func mappedState(blocks []testBlock, mangle func(i int, h []uint64)) []byte {
	b := stateHeader()
	b = append(b, "QEVM\x00\x00\x00\x03"...)
	b = append(b, "\x07\x00\x00\x00\x07microvm"...) // a configuration section
	b = append(b, 0x01, 0, 0, 0, 1)
	b = append(b, ramSectionStart...)
	var total int64
	for _, bl := range blocks {
		total += bl.used
	}
	b = binary.BigEndian.AppendUint64(b, uint64(total)|ramSectionFlagMem)
	for i, bl := range blocks {
		b = append(b, byte(len(bl.name)))
		b = append(b, bl.name...)
		b = binary.BigEndian.AppendUint64(b, uint64(bl.used))
		bitmap := int64(len(b)) + 28
		pages := roundUp(bitmap+bitmapBytes(bl.used), mappedRAMAlign)
		h := []uint64{mappedRAMVersion, mappedRAMPage, uint64(bitmap), uint64(pages)}
		if mangle != nil {
			mangle(i, h)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(h[0]))
		for _, v := range h[1:] {
			b = binary.BigEndian.AppendUint64(b, v)
		}
		if i < len(blocks)-1 {
			b = append(b, make([]byte, int64(pages)+bl.used-int64(len(b)))...)
		}
	}
	return b
}

// sized is b as a file of size bytes: zeros after b (not held), b cut
// at size.
func sized(b []byte, size int64) io.ReaderAt {
	if int64(len(b)) > size {
		b = b[:size]
	}
	return zeroTail{b, size}
}

type zeroTail struct {
	b    []byte
	size int64
}

func (z zeroTail) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= z.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && off+int64(n) < z.size {
		if i := off + int64(n); i < int64(len(z.b)) {
			n += copy(p[n:], z.b[i:])
		} else {
			m := min(int64(len(p)-n), z.size-i)
			clear(p[n : n+int(m)])
			n += int(m)
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func TestRAMRegionOf(t *testing.T) {
	const mib = 1 << 20
	ram := []testBlock{{"microvm.ram", 64 * mib}, {"pc.bios", 128 << 10}}
	full := mappedState(ram, nil)
	// The RAM's pages start at the first MiB boundary after its bitmap.
	wantRAM := RAMRegion{Offset: mib, Bytes: 64 * mib, Bitmap: int64(len(mappedState(ram[:1], nil)))}
	second := mappedState([]testBlock{{"pc.bios", 128 << 10}, {"microvm.ram", 64 * mib}}, nil)
	for _, tc := range []struct {
		name  string
		state []byte
		size  int64
		block string
		bytes int64
		want  RAMRegion
		err   string // a part of the error; "" for none
	}{
		{name: "the RAM first", state: full, size: 80 * mib, block: RAMID, bytes: 64 * mib, want: wantRAM},
		{name: "the RAM after the firmware", state: second, size: 80 * mib, block: RAMID, bytes: 64 * mib,
			want: RAMRegion{Offset: 2 * mib, Bytes: 64 * mib, Bitmap: int64(len(second))}},
		{name: "another block", state: full, size: 80 * mib, block: "pc.bios", bytes: 128 << 10,
			want: RAMRegion{Offset: 66 * mib, Bytes: 128 << 10, Bitmap: 65*mib + 1 + 7 + 8 + 28}},
		{name: "a RAM of another size", state: full, size: 80 * mib, block: RAMID, bytes: 32 * mib, err: "not 33554432"},
		{name: "no such block", state: full, size: 80 * mib, block: "nope", bytes: mib, err: `no RAM block "nope"`},
		{name: "pages past the end", state: full, size: 60 * mib, block: RAMID, bytes: 64 * mib, err: "past the file's end"},
		{name: "a classic stream", state: append(make([]byte, 0, 8192), "QEVM\x00\x00\x00\x03"...), size: 8192, block: RAMID, err: "no QEMU stream"},
		{name: "no RAM section", state: append(stateHeader(), "QEVM\x00\x00\x00\x03\x07xx"...), size: 8192, block: RAMID, err: "no RAM section"},
		{name: "an empty file", size: 0, block: RAMID, err: "no QEMU stream"},
		{name: "another header version", state: mappedState(ram, func(i int, h []uint64) { h[0] = 2 }), size: 80 * mib, block: RAMID, bytes: 64 * mib, err: "header version 2"},
		{name: "another page size", state: mappedState(ram, func(i int, h []uint64) { h[1] = 65536 }), size: 80 * mib, block: RAMID, bytes: 64 * mib, err: "page size 65536"},
		{name: "a bitmap elsewhere", state: mappedState(ram, func(i int, h []uint64) { h[2] += 8 }), size: 80 * mib, block: RAMID, bytes: 64 * mib, err: "not after its header"},
		{name: "pages elsewhere", state: mappedState(ram, func(i int, h []uint64) { h[3] += 4096 }), size: 80 * mib, block: RAMID, bytes: 64 * mib, err: "not where its bitmap ends"},
		{name: "a second block's header wrong", state: mappedState(ram, func(i int, h []uint64) {
			if i == 1 {
				h[3] = 0
			}
		}), size: 80 * mib, block: "pc.bios", bytes: 128 << 10, err: "not where its bitmap ends"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RAMRegionOf(sized(tc.state, tc.size), tc.size, tc.block, tc.bytes)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// FuzzRAMRegionOf: whatever a state file holds (a guest chooses its
// pages, and through them the bitmaps), the parser never panics, and a
// region it gives lies inside the file, page-aligned, of the size asked.
func FuzzRAMRegionOf(f *testing.F) {
	f.Add(mappedState([]testBlock{{"microvm.ram", 1 << 20}}, nil), int64(3<<20))
	// A first block that is not the RAM: the walk jumps past its pages,
	// into the zeros after the input.
	f.Add(mappedState([]testBlock{{"pc.bios", 8192}}, nil), int64(4<<20))
	f.Add(stateHeader(), int64(4096))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		if size < 0 || size > 1<<40 {
			return
		}
		r, err := RAMRegionOf(sized(b, size), size, RAMID, 1<<20)
		if err != nil {
			return
		}
		if r.Bytes != 1<<20 || r.Offset%mappedRAMPage != 0 || r.Offset < stateOffset || r.Offset+r.Bytes > size || r.Bitmap+bitmapBytes(r.Bytes) > r.Offset {
			t.Fatalf("region %+v of a %d-byte file", r, size)
		}
	})
}

// TestClearUnwritten: pages that hold data but whose bit is clear are
// punched; written pages and their bytes stay; a second run punches
// nothing.
func TestClearUnwritten(t *testing.T) {
	const pages = 256
	b := mappedState([]testBlock{{"microvm.ram", pages * mappedRAMPage}}, nil)
	path := filepath.Join(t.TempDir(), "state")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	region, err := RAMRegionOf(sized(b, 1<<20+pages*mappedRAMPage), 1<<20+pages*mappedRAMPage, RAMID, pages*mappedRAMPage)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(region.Offset + region.Bytes); err != nil {
		t.Fatal(err)
	}
	// Pages 0-9 and 100 written (bit set); 5 and 200-219 hold data with
	// their bit clear (a live save saw them zero later).
	bitmap := make([]byte, bitmapBytes(region.Bytes))
	page := bytes.Repeat([]byte{0xa5}, mappedRAMPage)
	for _, p := range []int{0, 1, 2, 3, 4, 6, 7, 8, 9, 100} {
		bitmap[p/8] |= 1 << (p % 8)
	}
	for p := range pages {
		if p < 10 || p == 100 || p >= 200 && p < 220 {
			if _, err := f.WriteAt(page, region.Offset+int64(p)*mappedRAMPage); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.WriteAt(bitmap, region.Bitmap); err != nil {
		t.Fatal(err)
	}
	punched, err := ClearUnwritten(f, region)
	if err != nil {
		t.Fatal(err)
	}
	if punched != 21*mappedRAMPage {
		t.Errorf("punched %d bytes, want %d (21 pages)", punched, 21*mappedRAMPage)
	}
	got := make([]byte, mappedRAMPage)
	for p := range pages {
		if _, err := f.ReadAt(got, region.Offset+int64(p)*mappedRAMPage); err != nil {
			t.Fatal(err)
		}
		written := bitmap[p/8]&(1<<(p%8)) != 0
		if want := written; bytes.Equal(got, page) != want || !want && !bytes.Equal(got, make([]byte, mappedRAMPage)) {
			t.Fatalf("page %d (written %v) reads %x…", p, written, got[:8])
		}
	}
	if again, err := ClearUnwritten(f, region); err != nil || again != 0 {
		t.Errorf("a second run punched %d, %v; want 0", again, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if held := st.Blocks * 512; held > region.Offset+11*mappedRAMPage+64<<10 {
		t.Errorf("the file holds %d bytes after the punch", held)
	}
}
