package loader

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// tcDevice is struct tc_device of bpf/types.h, the value of kpr_tc_devices:
// the node's address on the device per family, in the maps' 16-byte form
// (IPv4 as ::ffff:a.b.c.d), zero where it has none. The tc programs SNAT a
// flow to a backend on another node to it where the kernel's FIB lookup
// cannot name a source address (before Linux 6.7).
type tcDevice struct {
	Addr4 [16]byte
	Addr6 [16]byte
}

// tcDeviceSize is sizeof(struct tc_device); loading checks the map against
// it, so that a change on one side cannot go unnoticed.
const tcDeviceSize = 32

// deviceAddresses reads the node's addresses on iface, in the calling
// thread's network namespace.
func deviceAddresses(iface netlink.Link) (tcDevice, error) {
	addrs, err := netlink.AddrList(iface, netlink.FAMILY_ALL)
	if err != nil {
		return tcDevice{}, fmt.Errorf("list the addresses of device %s: %w", iface.Attrs().Name, err)
	}
	return pickDeviceAddresses(addrs), nil
}

// pickDeviceAddresses takes, per family, the first address a packet may
// leave from: global scope, not tentative or deprecated, as the kernel's
// own source selection prefers. The first is the primary one, which is
// what the kernel picks for a route without a preferred source.
func pickDeviceAddresses(addrs []netlink.Addr) tcDevice {
	var d tcDevice
	var have4, have6 bool
	for _, a := range addrs {
		if a.IPNet == nil || a.Scope != unix.RT_SCOPE_UNIVERSE ||
			a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DEPRECATED|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		switch {
		case ip.Is4() && !have4:
			d.Addr4, have4 = ip.As16(), true // ::ffff:a.b.c.d
		case ip.Is6() && !have6 && !ip.IsLinkLocalUnicast():
			d.Addr6, have6 = ip.As16(), true
		}
	}
	return d
}
