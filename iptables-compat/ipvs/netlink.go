package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/netnsexec"
)

// DeviceName is the dummy interface the virtual addresses are bound to, so
// that the kernel takes packets to them as its own and IPVS sees them.
// kube-proxy's is kube-ipvs0; kpr's own name keeps a kube-proxy on the
// same node (or its cleanup) and kpr from removing each other's addresses.
const DeviceName = "kpr-ipvs0"

// IPVS's persistence flag (IP_VS_SVC_F_PERSISTENT).
const flagPersistent = 0x1

// NetlinkKernel is the Kernel of a network namespace, through netlink.
type NetlinkKernel struct {
	// path is the namespace's file; empty is the caller's own.
	path string
	ipvs *mobyipvs.Handle
	nl   *netlink.Handle
}

var _ Kernel = (*NetlinkKernel)(nil)

// NewNetlinkKernel opens the IPVS and rtnetlink sockets of the network
// namespace at path, the calling thread's if empty. It fails when the
// kernel has no IPVS.
func NewNetlinkKernel(path string) (*NetlinkKernel, error) {
	if err := netfilter.IPVSAvailable(path); err != nil {
		return nil, fmt.Errorf("the kernel has no IPVS: %w, or run kpr in another --mode", err)
	}
	h, err := mobyipvs.New(path)
	if err != nil {
		return nil, fmt.Errorf("open an IPVS netlink socket: %w", err)
	}
	k := &NetlinkKernel{path: path, ipvs: h}
	if path == "" {
		k.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	} else {
		var ns netns.NsHandle
		if ns, err = netns.GetFromPath(path); err == nil {
			k.nl, err = netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
			ns.Close()
		}
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open an rtnetlink socket in %s: %w", path, err)
	}
	return k, nil
}

// Close closes the sockets.
func (k *NetlinkKernel) Close() {
	k.ipvs.Close()
	k.nl.Close()
}

func family(v6 bool) uint16 {
	if v6 {
		return unix.AF_INET6
	}
	return unix.AF_INET
}

func toMoby(s Service) *mobyipvs.Service {
	k := s.Key
	ms := &mobyipvs.Service{AddressFamily: family(k.IPv6), SchedName: s.Scheduler, Netmask: 0xffffffff}
	if k.IPv6 {
		ms.Netmask = 128
	}
	if k.FWMark != 0 {
		ms.FWMark = k.FWMark
	} else {
		ms.Address = net.IP(k.Addr.AsSlice())
		ms.Protocol = uint16(k.Proto)
		ms.Port = k.Port
	}
	if s.Timeout > 0 {
		ms.Flags |= flagPersistent
		ms.Timeout = s.Timeout
	}
	return ms
}

func keyOf(ms *mobyipvs.Service) (ServiceKey, bool) {
	v6 := ms.AddressFamily == unix.AF_INET6
	if ms.FWMark != 0 {
		return ServiceKey{IPv6: v6, FWMark: ms.FWMark}, true
	}
	a, ok := netip.AddrFromSlice(ms.Address)
	if !ok {
		return ServiceKey{}, false
	}
	if !v6 {
		a = a.Unmap()
	}
	return ServiceKey{IPv6: v6, Addr: a, Proto: dataplane.Protocol(ms.Protocol), Port: ms.Port}, true
}

func (k *NetlinkKernel) Services() (map[ServiceKey]*ServiceState, error) {
	svcs, err := k.ipvs.GetServices()
	if err != nil {
		return nil, err
	}
	out := map[ServiceKey]*ServiceState{}
	for _, ms := range svcs {
		key, ok := keyOf(ms)
		if !ok {
			continue
		}
		s := Service{Key: key, Scheduler: ms.SchedName}
		if ms.Flags&flagPersistent != 0 {
			s.Timeout = ms.Timeout
		}
		dests, err := k.dests(ms)
		if err != nil {
			return nil, fmt.Errorf("list the real servers of %s: %w", key, err)
		}
		out[key] = &ServiceState{Service: s, Dests: dests}
	}
	return out, nil
}

func (k *NetlinkKernel) dests(ms *mobyipvs.Service) (map[dataplane.Backend]Dest, error) {
	ds, err := k.ipvs.GetDestinations(ms)
	if err != nil {
		return nil, err
	}
	out := map[dataplane.Backend]Dest{}
	for _, d := range ds {
		a, ok := netip.AddrFromSlice(d.Address)
		if !ok {
			continue
		}
		out[dataplane.Backend{Addr: a.Unmap(), Port: d.Port}] = Dest{Weight: d.Weight, Active: d.ActiveConnections, Inactive: d.InactiveConnections}
	}
	return out, nil
}

func (k *NetlinkKernel) Dests(key ServiceKey) (map[dataplane.Backend]Dest, error) {
	return k.dests(toMoby(Service{Key: key}))
}

func (k *NetlinkKernel) AddService(s Service) error    { return k.ipvs.NewService(toMoby(s)) }
func (k *NetlinkKernel) UpdateService(s Service) error { return k.ipvs.UpdateService(toMoby(s)) }
func (k *NetlinkKernel) DelService(key ServiceKey) error {
	return k.ipvs.DelService(toMoby(Service{Key: key}))
}

func toMobyDest(b dataplane.Backend, weight int) *mobyipvs.Destination {
	a := b.Addr.Unmap()
	return &mobyipvs.Destination{Address: net.IP(a.AsSlice()), Port: b.Port, Weight: weight,
		AddressFamily: family(!a.Is4()), ConnectionFlags: mobyipvs.ConnectionFlagMasq}
}

func (k *NetlinkKernel) AddDest(key ServiceKey, b dataplane.Backend, weight int) error {
	return k.ipvs.NewDestination(toMoby(Service{Key: key}), toMobyDest(b, weight))
}

func (k *NetlinkKernel) UpdateDest(key ServiceKey, b dataplane.Backend, weight int) error {
	return k.ipvs.UpdateDestination(toMoby(Service{Key: key}), toMobyDest(b, weight))
}

func (k *NetlinkKernel) DelDest(key ServiceKey, b dataplane.Backend) error {
	return k.ipvs.DelDestination(toMoby(Service{Key: key}), toMobyDest(b, 0))
}

func (k *NetlinkKernel) EnsureDevice() error {
	l, err := k.nl.LinkByName(DeviceName)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if !errors.As(err, &notFound) {
			return err
		}
		if err := k.nl.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: DeviceName}}); err != nil {
			return fmt.Errorf("add dummy link (does the kernel have the dummy module?): %w", err)
		}
		if l, err = k.nl.LinkByName(DeviceName); err != nil {
			return err
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		return k.nl.LinkSetUp(l)
	}
	return nil
}

func (k *NetlinkKernel) link() (netlink.Link, error) {
	l, err := k.nl.LinkByName(DeviceName)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil, nil
	}
	return l, err
}

func (k *NetlinkKernel) DeviceAddrs() ([]netip.Addr, error) {
	l, err := k.link()
	if err != nil || l == nil {
		return nil, err
	}
	addrs, err := k.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		// The kernel gives an interface that comes up an IPv6 link-local
		// address of its own; it is no virtual address.
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLinkLocalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

func hostAddr(a netip.Addr) *netlink.Addr {
	a = a.Unmap()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
	if a.Is6() {
		// No duplicate address detection: the address is usable at once,
		// and every node carries the same virtual addresses.
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (k *NetlinkKernel) AddAddr(a netip.Addr) error {
	l, err := k.link()
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("%s does not exist", DeviceName)
	}
	return k.nl.AddrAdd(l, hostAddr(a))
}

func (k *NetlinkKernel) DelAddr(a netip.Addr) error {
	l, err := k.link()
	if err != nil || l == nil {
		return err
	}
	return k.nl.AddrDel(l, hostAddr(a))
}

func (k *NetlinkKernel) DelDevice() error {
	l, err := k.link()
	if err != nil || l == nil {
		return err
	}
	return k.nl.LinkDel(l)
}

// inNS runs an ipset call in the namespace: vishvananda/netlink's ipset
// calls open their socket in the calling thread's namespace, whatever
// handle they are called on.
func (k *NetlinkKernel) inNS(fn func() error) error {
	if k.path == "" {
		return fn()
	}
	return netnsexec.InPath(k.path, fn)
}

func (k *NetlinkKernel) EnsureSet(s SetSpec) error {
	return k.inNS(func() error {
		if _, err := netlink.IpsetList(s.Name); err == nil {
			return nil
		}
		fam := uint8(unix.AF_INET)
		if s.IPv6 {
			fam = unix.AF_INET6
		}
		err := netlink.IpsetCreate(s.Name, s.Type, netlink.IpsetCreateOptions{Family: fam, MaxElements: uint32(s.MaxElem)})
		if errors.Is(err, nl.IPSetError(nl.IPSET_ERR_EXIST)) {
			return nil
		}
		return err
	})
}

func (k *NetlinkKernel) SetEntries(name string) (entries []Entry, ok bool, err error) {
	err = k.inNS(func() error {
		res, lerr := netlink.IpsetList(name)
		if lerr != nil {
			if errors.Is(lerr, syscall.ENOENT) || errors.Is(lerr, nl.IPSetError(nl.IPSET_ERR_PROTOCOL)) || isNoSet(lerr) {
				return nil
			}
			return lerr
		}
		ok = true
		for _, e := range res.Entries {
			entries = append(entries, fromNetlink(e))
		}
		return nil
	})
	return entries, ok, err
}

// isNoSet reports whether err says the set does not exist; the kernel
// answers a list of a missing set with IPSET_ERR_PROTOCOL on some
// versions and ENOENT on others.
func isNoSet(err error) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) && (errno == syscall.ENOENT || errno == nl.IPSET_ERR_PROTOCOL)
}

func fromNetlink(e netlink.IPSetEntry) Entry {
	var out Entry
	if a, ok := netip.AddrFromSlice(e.IP); ok {
		out.Addr = a.Unmap()
	}
	if e.Protocol != nil {
		out.Proto = dataplane.Protocol(*e.Protocol)
	}
	if e.Port != nil {
		out.Port = *e.Port
	}
	if a, ok := netip.AddrFromSlice(e.IP2); ok {
		a = a.Unmap()
		if e.CIDR2 != 0 {
			out.Net = netip.PrefixFrom(a, int(e.CIDR2)).Masked()
		} else {
			out.Addr2 = a
		}
	}
	return out
}

func toNetlink(e Entry) *netlink.IPSetEntry {
	out := &netlink.IPSetEntry{IP: net.IP(e.Addr.Unmap().AsSlice())}
	if e.Proto == 0 {
		return out // a hash:ip member: an address alone
	}
	proto, port := uint8(e.Proto), e.Port
	out.Protocol, out.Port = &proto, &port
	switch {
	case e.Net.IsValid():
		out.IP2 = net.IP(e.Net.Addr().Unmap().AsSlice())
		out.CIDR2 = uint8(e.Net.Bits())
	case e.Addr2.IsValid():
		out.IP2 = net.IP(e.Addr2.Unmap().AsSlice())
	}
	return out
}

func (k *NetlinkKernel) AddEntry(set string, e Entry) error {
	return k.inNS(func() error { return netlink.IpsetAdd(set, toNetlink(e)) })
}

func (k *NetlinkKernel) DelEntry(set string, e Entry) error {
	return k.inNS(func() error { return netlink.IpsetDel(set, toNetlink(e)) })
}

func (k *NetlinkKernel) DestroySet(name string) error {
	return k.inNS(func() error {
		err := netlink.IpsetDestroy(name)
		if err != nil && isNoSet(err) {
			return nil
		}
		return err
	})
}

// SetSysctls sets what IPVS needs in the calling thread's network
// namespace, as kube-proxy's IPVS mode does: conntrack for IPVS
// connections, so that the masquerade rules apply to them; expiry of
// connections to removed real servers, so that a drained UDP flow moves
// on; forwarding. With strictARP (--ipvs-strict-arp) it also sets
// arp_ignore=1 and arp_announce=2 on every interface: the Service
// addresses are bound to the dummy interface, and without them the node
// answers ARP for each of them on every link, and announces them as the
// source of its own ARP requests, drawing a load-balancer IP that MetalLB
// announces from another node to this one. Each setting is tried; the
// error names every one that failed.
func SetSysctls(strictARP bool) error {
	settings := [][2]string{
		{"net/ipv4/vs/conntrack", "1"},
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		{"net/ipv4/ip_forward", "1"},
	}
	if strictARP {
		settings = append(settings, [2]string{"net/ipv4/conf/all/arp_ignore", "1"}, [2]string{"net/ipv4/conf/all/arp_announce", "2"})
	}
	var errs []error
	for _, s := range settings {
		if err := os.WriteFile(filepath.Join("/proc/sys", s[0]), []byte(s[1]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("set %s to %s (the IPVS mode needs it): %w", s[0], s[1], err))
		}
	}
	return errors.Join(errs...)
}

// Timeouts are IPVS's own connection timeouts (ipvsadm --set), which
// kube-proxy's --ipvs-tcp-timeout, --ipvs-tcpfin-timeout and
// --ipvs-udp-timeout set at start-up. A zero leaves the kernel's value.
type Timeouts struct {
	TCP, TCPFin, UDP time.Duration
}

// SetTimeouts writes t into the namespace's IPVS, as kube-proxy does.
func (k *NetlinkKernel) SetTimeouts(t Timeouts) error {
	if t == (Timeouts{}) {
		return nil
	}
	if err := k.ipvs.SetConfig(&mobyipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP}); err != nil {
		return fmt.Errorf("set the IPVS timeouts (tcp %s, tcpfin %s, udp %s; 0 leaves one): %w", t.TCP, t.TCPFin, t.UDP, err)
	}
	return nil
}

// timeouts reads the namespace's IPVS timeouts back.
func (k *NetlinkKernel) timeouts() (Timeouts, error) {
	c, err := k.ipvs.GetConfig()
	if err != nil {
		return Timeouts{}, err
	}
	return Timeouts{TCP: c.TimeoutTCP, TCPFin: c.TimeoutTCPFin, UDP: c.TimeoutUDP}, nil
}
