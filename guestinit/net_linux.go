package guestinit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// netUp brings up the guest's NIC as GuestNet says, with its default
// route, and writes /etc/resolv.conf. The route is added over rtnetlink
// by hand (two attributes): no netlink library in strata-init for one
// message.
func (s *system) netUp() error {
	for path, v := range NetSysctls() {
		_ = os.WriteFile(path, []byte(v), 0) // no IPv6 in the kernel: nothing to turn off
	}
	name := GuestNet.Interface
	var ifi *net.Interface
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if ifi, err = net.InterfaceByName(name); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s: %w", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	set := func(req uint, what string, fill func(*unix.Ifreq) error) error {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		if err := fill(ifr); err != nil {
			return err
		}
		if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	addr, mask := GuestNet.Addr.Addr().AsSlice(), net.CIDRMask(GuestNet.Addr.Bits(), 32)
	if err := set(unix.SIOCSIFADDR, "SIOCSIFADDR", func(r *unix.Ifreq) error { return r.SetInet4Addr(addr) }); err != nil {
		return err
	}
	if err := set(unix.SIOCSIFNETMASK, "SIOCSIFNETMASK", func(r *unix.Ifreq) error { return r.SetInet4Addr(mask) }); err != nil {
		return err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS: %w", err)
	}
	if err := addDefaultRoute(ifi.Index, GuestNet.Gateway.As4()); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("default route: %w", err)
	}
	const resolv = "/etc/resolv.conf"
	if b, err := os.ReadFile(resolv); err != nil || string(b) != ResolvConf() {
		_ = os.Remove(resolv) // a link to a resolver that is not here
		if err := os.WriteFile(resolv, []byte(ResolvConf()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// addDefaultRoute adds "default via gw dev index" to the main table.
func addDefaultRoute(index int, gw [4]byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	if err := unix.Sendto(fd, RouteMessage(index, gw), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	return RouteAnswer(buf[:n])
}
