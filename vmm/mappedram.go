package vmm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// A mapped-ram state keeps each RAM block's pages at fixed offsets of the
// file, page i of a block at its pages offset + i×page: a fork can map
// the guest RAM's block straight from a memory snapshot's state
// (memory-backend-file with offset=), with no copy of it anywhere. What
// QEMU writes before the pages says where they are; QEMU has no command
// that reports it, so RAMRegionOf reads it from the stream (QEMU's
// migration/ram.c, mapped_ram_setup_ramblock, format version 1):
//
//	stream:  "QEVM" be32(3), a configuration section, then the RAM
//	         section's start: 0x01 be32(section) 0x03 "ram" be32(0) be32(4)
//	         be64(total RAM bytes | 0x04)
//	a block: u8 len, its name, be64 used length, then the mapped-ram
//	         header (packed): be32 version (1), be64 page size,
//	         be64 bitmap offset, be64 pages offset;
//	         the next block's begins at pages offset + used length.
//
// Offsets are the file's own (QEMU seeks its channel to stateOffset
// first). The bitmap has a bit per page, set when the page was written;
// a page whose bit is clear is zero to a load, whatever the file holds
// there (a live save that wrote a page and saw it zero later clears its
// bit but leaves its bytes): ClearUnwritten punches those pages, so that
// a mapping reads what a load would.
//
// Everything here is checked against what QEMU writes and nothing is
// guessed: a state of another layout (another QEMU, another capability)
// is an error, and the caller then loads the state instead of mapping it.

// RAMRegion is where a RAM block's pages are in a mapped-ram state.
type RAMRegion struct {
	// Offset is the file offset of the block's first page; Bytes its
	// length (the block's used length).
	Offset, Bytes int64
	// Bitmap is the file offset of the block's bitmap of written pages.
	Bitmap int64
}

const (
	mappedRAMVersion  = 1
	mappedRAMPage     = 4096
	mappedRAMAlign    = 1 << 20 // MAPPED_RAM_FILE_OFFSET_ALIGNMENT
	ramSectionFlagMem = 0x04    // RAM_SAVE_FLAG_MEM_SIZE
	// ramSectionScan is how far after the stream's start the RAM
	// section's start may be: after the configuration section, which
	// names the machine and the capabilities (a few hundred bytes).
	ramSectionScan = 64 << 10
	// maxRAMBlocks bounds the walk over a stream's RAM blocks (microvm
	// has a handful: its RAM, the firmware, option ROMs).
	maxRAMBlocks = 64
)

// ramSectionStart is what starts the RAM section after its section id:
// the name "ram", instance 0, version 4.
var ramSectionStart = []byte("\x03ram\x00\x00\x00\x00\x00\x00\x00\x04")

// RAMRegionOf finds the RAM block named block (RAMID for a machine's RAM)
// in the mapped-ram state f of size bytes, and checks that it is
// ramBytes long.
func RAMRegionOf(f io.ReaderAt, size int64, block string, ramBytes int64) (RAMRegion, error) {
	if size < stateOffset+8 {
		return RAMRegion{}, fmt.Errorf("mapped-ram state: %d bytes: no QEMU stream at offset %d", size, stateOffset)
	}
	head := make([]byte, min(size, stateOffset+ramSectionScan))
	if _, err := f.ReadAt(head, 0); err != nil {
		return RAMRegion{}, fmt.Errorf("mapped-ram state: reading its start: %w", err)
	}
	return parseRAMRegion(head, f, size, block, ramBytes)
}

// parseRAMRegion is RAMRegionOf on head, the file's first bytes, and f
// for what lies beyond them.
func parseRAMRegion(head []byte, f io.ReaderAt, size int64, block string, ramBytes int64) (RAMRegion, error) {
	bad := func(format string, args ...any) (RAMRegion, error) {
		return RAMRegion{}, fmt.Errorf("mapped-ram state: "+format, args...)
	}
	if len(head) < stateOffset+8 || string(head[stateOffset:stateOffset+4]) != "QEVM" ||
		binary.BigEndian.Uint32(head[stateOffset+4:]) != 3 {
		return bad("no QEMU stream of version 3 at offset %d", stateOffset)
	}
	// The section's first match: what comes before it is QEMU's own
	// (the configuration section); what comes after may be a bitmap,
	// whose bits a guest chooses.
	stream := head[stateOffset:]
	i := bytes.Index(stream, ramSectionStart)
	if i < 5 || stream[i-5] != 0x01 {
		return bad("no RAM section start in its first %d bytes", len(stream))
	}
	pos := int64(stateOffset + i + len(ramSectionStart))
	total, err := be64At(f, pos)
	if err != nil {
		return bad("reading the RAM's size: %v", err)
	}
	if total&ramSectionFlagMem == 0 {
		return bad("the RAM section starts with flags %#x, not its size", total&(mappedRAMPage-1))
	}
	left := int64(total &^ (mappedRAMPage - 1))
	pos += 8
	for n := 0; left > 0; n++ {
		if n == maxRAMBlocks {
			return bad("more than %d RAM blocks", maxRAMBlocks)
		}
		var l [1]byte
		if _, err := f.ReadAt(l[:], pos); err != nil {
			return bad("reading block %d: %v", n, err)
		}
		rec := make([]byte, 1+int(l[0])+8+28)
		if _, err := f.ReadAt(rec, pos); err != nil {
			return bad("reading block %d: %v", n, err)
		}
		name := string(rec[1 : 1+l[0]])
		h := rec[1+l[0]:]
		used := int64(binary.BigEndian.Uint64(h))
		version := binary.BigEndian.Uint32(h[8:])
		page := binary.BigEndian.Uint64(h[12:])
		bitmap := int64(binary.BigEndian.Uint64(h[20:]))
		pages := int64(binary.BigEndian.Uint64(h[28:]))
		after := pos + int64(len(rec))
		switch {
		case version != mappedRAMVersion || page != mappedRAMPage:
			return bad("block %q: header version %d, page size %d: want %d and %d", name, version, page, mappedRAMVersion, mappedRAMPage)
		case used <= 0 || used%mappedRAMPage != 0 || used > left:
			return bad("block %q: used length %d of %d left", name, used, left)
		case bitmap != after:
			return bad("block %q: bitmap at %d, not after its header (%d)", name, bitmap, after)
		case pages != roundUp(bitmap+bitmapBytes(used), mappedRAMAlign):
			return bad("block %q: pages at %d, not where its bitmap ends", name, pages)
		case pages > size-used:
			return bad("block %q: pages at %d, %d bytes, past the file's end (%d)", name, pages, used, size)
		}
		if name == block {
			if used != ramBytes {
				return bad("block %q is %d bytes, not %d", name, used, ramBytes)
			}
			return RAMRegion{Offset: pages, Bytes: used, Bitmap: bitmap}, nil
		}
		left -= used
		pos = pages + used
	}
	return bad("no RAM block %q", block)
}

// bitmapBytes is the size of the bitmap of a block of used bytes: a bit
// per page, in 64-bit words (QEMU's unsigned longs).
func bitmapBytes(used int64) int64 {
	return (used/mappedRAMPage + 63) / 64 * 8
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

func be64At(f io.ReaderAt, off int64) (uint64, error) {
	var b [8]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// ClearUnwritten punches the pages of region that hold data in the file
// but whose bit in its bitmap is clear, so that the region reads as a
// load of the state would fill the RAM. It changes nothing a load reads,
// and is idempotent: safe to run again after a crash, and on a state a
// restore is loading. The bitmap is in the host's byte order (QEMU writes
// its unsigned longs as they are; strata runs on little-endian hosts).
func ClearUnwritten(f *os.File, region RAMRegion) (punched int64, err error) {
	bitmap := make([]byte, bitmapBytes(region.Bytes))
	if _, err := f.ReadAt(bitmap, region.Bitmap); err != nil {
		return 0, fmt.Errorf("mapped-ram state: reading the bitmap: %w", err)
	}
	written := func(page int64) bool { return bitmap[page/8]&(1<<(page%8)) != 0 }
	fd := int(f.Fd())
	end := region.Offset + region.Bytes
	for off := region.Offset; off < end; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) || err == nil && data >= end {
			break // no data left in the region
		}
		if err != nil {
			return punched, fmt.Errorf("mapped-ram state: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return punched, fmt.Errorf("mapped-ram state: %w", err)
		}
		hole = min(hole, end)
		// Runs of clear bits in [data, hole), page-aligned (data
		// extents are block-aligned; the region is page-aligned).
		first := (data - region.Offset) / mappedRAMPage
		last := (hole - region.Offset + mappedRAMPage - 1) / mappedRAMPage
		for p := first; p < last; {
			if written(p) {
				p++
				continue
			}
			q := p
			for q < last && !written(q) {
				q++
			}
			start, length := region.Offset+p*mappedRAMPage, (q-p)*mappedRAMPage
			if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, start, length); err != nil {
				return punched, fmt.Errorf("mapped-ram state: punching %d bytes at %d: %w", length, start, err)
			}
			punched += length
			p = q
		}
		off = hole
	}
	return punched, nil
}
