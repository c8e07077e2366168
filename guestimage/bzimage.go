package guestimage

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Compression is how a bzImage's payload (the kernel ELF) is compressed.
type Compression string

// The compressions of Debian's kernels: 6.12 is zstd, 6.1 cloud is LZ4
// (legacy frame, as the kernel's build writes it), older ones xz.
const (
	Zstd Compression = "zstd"
	XZ   Compression = "xz"
	LZ4  Compression = "lz4"
)

var magics = []struct {
	c     Compression
	magic []byte
}{
	{Zstd, []byte{0x28, 0xB5, 0x2F, 0xFD}},
	{XZ, []byte{0xFD, '7', 'z', 'X', 'Z', 0x00}},
	{LZ4, []byte{0x02, 0x21, 0x4C, 0x18}},
}

// Payload finds the compressed kernel inside a bzImage. With a boot
// protocol header (2.08+: payload_offset and payload_length after the
// setup sectors) it takes exactly that payload, and fails when its magic
// is unknown: a scan would find magics inside compressed data. Without a
// header it takes the first known magic in the file and runs to its end.
// The payload may carry trailing bytes (the kernel appends its size): the
// decompressor must tolerate them.
func Payload(img []byte) ([]byte, Compression, error) {
	if p, ok := headerPayload(img); ok {
		for _, m := range magics {
			if bytes.HasPrefix(p, m.magic) {
				return p, m.c, nil
			}
		}
		return nil, "", fmt.Errorf("the bzImage's payload starts with % x: not zstd, xz or lz4", p[:min(len(p), 6)])
	}
	best, bestC := -1, Compression("")
	for _, m := range magics {
		if i := bytes.Index(img, m.magic); i >= 0 && (best < 0 || i < best) {
			best, bestC = i, m.c
		}
	}
	if best < 0 {
		return nil, "", fmt.Errorf("no zstd, xz or lz4 payload in the bzImage")
	}
	return img[best:], bestC, nil
}

func headerPayload(img []byte) ([]byte, bool) {
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" || binary.LittleEndian.Uint16(img[0x206:]) < 0x208 {
		return nil, false
	}
	setup := int(img[0x1f1])
	if setup == 0 {
		setup = 4
	}
	start := uint64(setup+1)*512 + uint64(binary.LittleEndian.Uint32(img[0x248:]))
	end := start + uint64(binary.LittleEndian.Uint32(img[0x24c:]))
	if start >= uint64(len(img)) || end > uint64(len(img)) || end <= start {
		return nil, false
	}
	return img[start:end], true
}

// CheckVmlinux checks that b starts as an x86-64 executable ELF.
func CheckVmlinux(b []byte) error {
	if len(b) < 20 || string(b[:4]) != "\x7fELF" {
		return fmt.Errorf("not an ELF file")
	}
	if b[4] != 2 || b[5] != 1 {
		return fmt.Errorf("not a 64-bit little-endian ELF")
	}
	if t := binary.LittleEndian.Uint16(b[16:]); t != 2 {
		return fmt.Errorf("ELF type %d, want 2 (executable)", t)
	}
	if m := binary.LittleEndian.Uint16(b[18:]); m != 0x3e {
		return fmt.Errorf("ELF machine %#x, want x86-64", m)
	}
	return nil
}
