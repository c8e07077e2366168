package guestinit

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRouteMessage(t *testing.T) {
	m := RouteMessage(2, [4]byte{10, 0, 2, 2})
	if got := binary.NativeEndian.Uint32(m[0:4]); int(got) != len(m) || len(m) != 16+12+8+8 {
		t.Fatalf("length %d in a message of %d bytes", got, len(m))
	}
	if binary.NativeEndian.Uint16(m[4:6]) != unix.RTM_NEWROUTE {
		t.Fatal("not RTM_NEWROUTE")
	}
	// rtmsg: IPv4, a /0 destination, the main table, unicast.
	if r := m[16:28]; r[0] != unix.AF_INET || r[1] != 0 || r[4] != unix.RT_TABLE_MAIN || r[7] != unix.RTN_UNICAST {
		t.Fatalf("rtmsg % x", r)
	}
	gw, oif := m[28:36], m[36:44]
	if binary.NativeEndian.Uint16(gw[2:4]) != unix.RTA_GATEWAY || string(gw[4:8]) != "\x0a\x00\x02\x02" {
		t.Fatalf("gateway attribute % x", gw)
	}
	if binary.NativeEndian.Uint16(oif[2:4]) != unix.RTA_OIF || binary.NativeEndian.Uint32(oif[4:8]) != 2 {
		t.Fatalf("interface attribute % x", oif)
	}
}

func ack(errno int32, typ uint16) []byte {
	b := make([]byte, 36)
	binary.NativeEndian.PutUint32(b[0:4], 36)
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint32(b[16:20], uint32(-errno))
	return b
}

func TestRouteAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
		msg  string
	}{
		{name: "ack", in: ack(0, unix.NLMSG_ERROR)},
		{name: "exists", in: ack(int32(unix.EEXIST), unix.NLMSG_ERROR), want: unix.EEXIST},
		{name: "unreachable", in: ack(int32(unix.ENETUNREACH), unix.NLMSG_ERROR), want: unix.ENETUNREACH},
		{name: "short", in: []byte{1, 2, 3}, msg: "short"},
		{name: "other type", in: ack(0, unix.RTM_NEWROUTE), msg: "type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := RouteAnswer(tc.in)
			switch {
			case tc.msg != "":
				if err == nil || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("%v, want an error saying %q", err, tc.msg)
				}
			case !errors.Is(err, tc.want) && err != tc.want:
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}

func FuzzRouteAnswer(f *testing.F) {
	f.Add(ack(0, unix.NLMSG_ERROR))
	f.Add(ack(17, unix.NLMSG_ERROR))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = RouteAnswer(b) // never panics, whatever rtnetlink sent
	})
}

func TestResolvConf(t *testing.T) {
	if !strings.Contains(ResolvConf(), "\nnameserver 10.0.2.3\n") {
		t.Fatalf("resolv.conf:\n%s", ResolvConf())
	}
}
