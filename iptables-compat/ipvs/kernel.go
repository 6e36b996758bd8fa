package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// ServiceKey identifies one IPVS virtual server: an address, protocol and
// port, or (FWMark set, the rest zero) the packets carrying a firewall
// mark.
type ServiceKey struct {
	IPv6   bool
	Addr   netip.Addr
	Proto  dataplane.Protocol
	Port   uint16
	FWMark uint32
}

func (k ServiceKey) String() string {
	if k.FWMark != 0 {
		fam := "IPv4"
		if k.IPv6 {
			fam = "IPv6"
		}
		return fmt.Sprintf("fwmark 0x%x %s", k.FWMark, fam)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.Addr, k.Port), k.Proto)
}

// addrKey is the virtual server of an address, protocol and port.
func addrKey(a netip.Addr, proto dataplane.Protocol, port uint16) ServiceKey {
	a = a.Unmap()
	return ServiceKey{IPv6: !a.Is4(), Addr: a, Proto: proto, Port: port}
}

// Service is a virtual server's settings.
type Service struct {
	Key       ServiceKey
	Scheduler string
	// Timeout is the persistence timeout in seconds (ClientIP affinity);
	// 0 is none.
	Timeout uint32
}

// Dest is one real server of a virtual server as the kernel has it.
type Dest struct {
	Weight int
	// Active and Inactive are its connections, for the reaper.
	Active, Inactive int
}

// ServiceState is a virtual server and its real servers.
type ServiceState struct {
	Service
	Dests map[dataplane.Backend]Dest
}

// Entry is one ipset member: an address, protocol and port, and for the
// source-range set a source prefix, for the loop-back set a second
// address; for the hash:ip set of bound addresses an address alone (no
// protocol).
type Entry struct {
	Addr  netip.Addr
	Proto dataplane.Protocol
	Port  uint16
	Net   netip.Prefix
	Addr2 netip.Addr
}

func (e Entry) String() string {
	if e.Proto == 0 {
		return e.Addr.String()
	}
	s := fmt.Sprintf("%s,%s:%d", e.Addr, netfilter.ProtoName(e.Proto), e.Port)
	if e.Net.IsValid() {
		s += "," + e.Net.String()
	}
	if e.Addr2.IsValid() {
		s += "," + e.Addr2.String()
	}
	return s
}

// SetSpec is an ipset kpr keeps.
type SetSpec struct {
	Name string
	// Type is the ipset type: hash:ip,port, hash:ip,port,net,
	// hash:ip,port,ip or hash:ip.
	Type string
	IPv6 bool
	// MaxElem is the most members the set holds (ipset's maxelem); 0 is
	// ipset's default. A set that exists keeps its own.
	MaxElem int
}

// Kernel is what the Plane reads and writes besides iptables: IPVS, the
// dummy interface's addresses and the ipsets. Every method that changes
// something is one write, the unit the conformance suite fails.
type Kernel interface {
	Services() (map[ServiceKey]*ServiceState, error)
	Dests(k ServiceKey) (map[dataplane.Backend]Dest, error)
	AddService(s Service) error
	UpdateService(s Service) error
	DelService(k ServiceKey) error
	AddDest(k ServiceKey, b dataplane.Backend, weight int) error
	UpdateDest(k ServiceKey, b dataplane.Backend, weight int) error
	DelDest(k ServiceKey, b dataplane.Backend) error

	// EnsureDevice creates the dummy interface, up, if it is missing.
	EnsureDevice() error
	// DeviceAddrs are the addresses bound to it; none if it is missing.
	DeviceAddrs() ([]netip.Addr, error)
	AddAddr(a netip.Addr) error
	DelAddr(a netip.Addr) error
	// DelDevice deletes the interface and so its addresses; a missing one
	// is nothing to do.
	DelDevice() error

	// EnsureSet creates the set if it is missing.
	EnsureSet(s SetSpec) error
	// SetEntries lists a set's members; ok is false when it does not exist.
	SetEntries(name string) (entries []Entry, ok bool, err error)
	AddEntry(set string, e Entry) error
	DelEntry(set string, e Entry) error
	// DestroySet destroys a set; a missing one is nothing to do.
	DestroySet(name string) error
}
