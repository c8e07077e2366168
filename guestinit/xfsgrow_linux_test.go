package guestinit

import (
	"testing"
	"unsafe"
)

// TestXFSIoctlLayouts: the structs passed to the kernel have the sizes
// its ioctl numbers encode (bits 16-29).
func TestXFSIoctlLayouts(t *testing.T) {
	for _, tt := range []struct {
		name string
		req  uint
		size uintptr
	}{
		{"XFS_IOC_FSGEOMETRY_V1", xfsIocFSGeometryV1, unsafe.Sizeof(xfsGeomV1{})},
		{"XFS_IOC_FSGROWFSDATA", xfsIocFSGrowFSData, unsafe.Sizeof(xfsGrowData{})},
	} {
		if got := uintptr(tt.req>>16) & 0x3fff; got != tt.size {
			t.Errorf("%s: the ioctl number encodes %d bytes, the struct has %d", tt.name, got, tt.size)
		}
		if tt.req>>8&0xff != 'X' {
			t.Errorf("%s: type %q", tt.name, rune(tt.req>>8&0xff))
		}
	}
}
