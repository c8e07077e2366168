package guestimage

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// CpioWriter writes a cpio archive in the "newc" format that the kernel
// unpacks as an initramfs. Entries carry uid and gid 0 and mtime 0, so the
// same inputs give the same bytes. Parents must be written before their
// children.
type CpioWriter struct {
	w   *bufio.Writer
	ino uint32
	err error
}

// NewCpioWriter starts an archive on w.
func NewCpioWriter(w io.Writer) *CpioWriter {
	return &CpioWriter{w: bufio.NewWriter(w), ino: 1}
}

const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChr  = 0o020000
)

// Dir adds a directory.
func (c *CpioWriter) Dir(name string, perm uint32) error {
	return c.entry(name, cpioDir|perm&0o7777, 2, 0, 0, 0, nil)
}

// CharDev adds a character device node.
func (c *CpioWriter) CharDev(name string, perm uint32, major, minor uint32) error {
	return c.entry(name, cpioChr|perm&0o7777, 1, major, minor, 0, nil)
}

// File adds a regular file of size bytes read from r.
func (c *CpioWriter) File(name string, perm uint32, size int64, r io.Reader) error {
	return c.entry(name, cpioFile|perm&0o7777, 1, 0, 0, size, r)
}

// Close writes the trailer and flushes; it does not close the underlying
// writer.
func (c *CpioWriter) Close() error {
	if err := c.entry("TRAILER!!!", 0, 1, 0, 0, 0, nil); err != nil {
		return err
	}
	return c.w.Flush()
}

func (c *CpioWriter) entry(name string, mode, nlink, rmajor, rminor uint32, size int64, r io.Reader) error {
	if c.err != nil {
		return c.err
	}
	name = strings.TrimPrefix(name, "/")
	if name == "" || strings.Contains(name, "\x00") || size < 0 || size > 0xffffffff {
		c.err = fmt.Errorf("cpio: bad entry %q (size %d)", name, size)
		return c.err
	}
	ino := c.ino
	c.ino++
	if name == "TRAILER!!!" {
		ino = 0
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, rmajor, rminor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	if size > 0 {
		n, err := io.CopyN(c.w, r, size)
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("cpio: %s: %w", name, err)
		}
		c.pad(int(n))
	}
	return c.err
}

func (c *CpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *CpioWriter) pad(n int) {
	if rem := n % 4; rem != 0 {
		c.write(make([]byte, 4-rem))
	}
}
