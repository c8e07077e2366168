package layers

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FIEMAP (linux/fiemap.h), which x/sys does not define.
const (
	fsIocFiemap    = 0xC020660B
	fiemapHeader   = 32 // struct fiemap without its extents
	fiemapExtent   = 56 // struct fiemap_extent
	fiemapMaxExts  = 64
	fiemapFlagSync = 0x1
	fiemapLast     = 0x1
	fiemapShared   = 0x2000
	fiemapUnstable = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 // unknown, delalloc, encoded, encrypted, not aligned, inline, tail
)

// fileExtent is one extent as FIEMAP reports it.
type fileExtent struct {
	logical, physical, length uint64
	flags                     uint32
}

// extents returns the extents of the file open at f, or ok false when
// they cannot prove anything: the filesystem has no FIEMAP, an extent's
// place is not settled on disk (delayed allocation, inline data, …), or
// there are more than fiemapMaxExts.
func extents(f *os.File) (out []fileExtent, ok bool) {
	buf := make([]uint64, (fiemapHeader+fiemapMaxExts*fiemapExtent)/8)
	hdr := (*[fiemapHeader + fiemapMaxExts*fiemapExtent]byte)(unsafe.Pointer(&buf[0]))
	buf[0], buf[1] = 0, ^uint64(0) // fm_start, fm_length
	// FIEMAP_FLAG_SYNC: dirty data is written first, so a clone written
	// since (copy on write not yet allocated) cannot look shared.
	*(*uint32)(unsafe.Pointer(&hdr[16])) = fiemapFlagSync
	*(*uint32)(unsafe.Pointer(&hdr[24])) = fiemapMaxExts // fm_extent_count
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, false
	}
	var ioErr error
	if err := raw.Control(func(fd uintptr) {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, fsIocFiemap, uintptr(unsafe.Pointer(&buf[0])))
		if e != 0 {
			ioErr = e
		}
	}); err != nil || ioErr != nil {
		return nil, false
	}
	n := int(*(*uint32)(unsafe.Pointer(&hdr[20]))) // fm_mapped_extents
	if n > fiemapMaxExts {
		return nil, false
	}
	last := n == 0
	for i := range n {
		e := hdr[fiemapHeader+i*fiemapExtent:]
		x := fileExtent{
			logical:  *(*uint64)(unsafe.Pointer(&e[0])),
			physical: *(*uint64)(unsafe.Pointer(&e[8])),
			length:   *(*uint64)(unsafe.Pointer(&e[16])),
			flags:    *(*uint32)(unsafe.Pointer(&e[40])),
		}
		if x.flags&fiemapUnstable != 0 {
			return nil, false
		}
		last = x.flags&fiemapLast != 0
		x.flags &^= fiemapShared
		out = append(out, x)
	}
	// A full buffer without the last extent: there are more.
	return out, last
}

// sameBlocks reports whether two files of the same size are the same
// blocks on disk (the same file, or clones of one never written since):
// then their content is equal without reading it. false says nothing.
func sameBlocks(a, b *os.File) bool {
	ea, ok := extents(a)
	if !ok {
		return false
	}
	eb, ok := extents(b)
	if !ok || len(ea) != len(eb) || len(ea) == 0 {
		return false
	}
	for i := range ea {
		if ea[i] != eb[i] {
			return false
		}
	}
	return true
}
