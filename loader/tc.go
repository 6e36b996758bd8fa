package loader

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/nodeaddrs"
)

// The packet-level programs of bpf/tc_nodeport.c, on the node's external
// devices: ingress translates traffic from other machines to a NodePort,
// ExternalIP or LoadBalancer IP, egress restores the replies. tchooks.go
// says how they are attached.
//
// Devices are named, and looked up, in TCOptions.NetNS, or else in the
// calling thread's network namespace.

// TCAttachMode picks how the tc programs are attached.
type TCAttachMode int

const (
	// TCAttachAuto uses tcx where the kernel has it, else clsact.
	TCAttachAuto TCAttachMode = iota
	// TCAttachTCX insists on tcx.
	TCAttachTCX
	// TCAttachLegacy uses a clsact qdisc and BPF filters even where tcx
	// exists.
	TCAttachLegacy
)

func (m TCAttachMode) String() string {
	switch m {
	case TCAttachAuto:
		return "auto"
	case TCAttachTCX:
		return "tcx"
	case TCAttachLegacy:
		return "clsact"
	}
	return fmt.Sprintf("TCAttachMode(%d)", int(m))
}

// ConntrackTimeouts are the lifetimes of the tc programs' conntrack
// entries. Zero keeps the default compiled into the object, which is the
// netfilter timeout kube-proxy runs with.
type ConntrackTimeouts struct {
	// TCPSyn is the lifetime of a TCP flow whose handshake has not
	// completed in both directions (a segment without SYN from each
	// side): 60 s, netfilter's SYN_RECV.
	TCPSyn         time.Duration
	TCPEstablished time.Duration // an established TCP flow (24 h)
	TCPFin         time.Duration // after a FIN in either direction (120 s)
	TCPRst         time.Duration // after a RST in either direction (10 s)
	UDP            time.Duration // a UDP flow without a reply yet (30 s)
	UDPStream      time.Duration // an answered UDP flow (120 s)
}

// TCOptions configure the tc programs.
type TCOptions struct {
	// Devices are the interfaces to attach to. Empty loads the programs
	// without attaching them.
	Devices []string
	// NetNS is the network namespace file (/proc/PID/ns/net or a bind
	// mount) the devices are in: the node's own network. Empty means the
	// calling thread's.
	NetNS    string
	Mode     TCAttachMode
	Timeouts ConntrackTimeouts
	// SNATPorts is the range of source ports (first, last) flows to a
	// backend on another node get, per backend address and port. Zero
	// keeps the default compiled into the programs (DefaultSNATPorts):
	// below the kernel's default ephemeral range, so that they never meet
	// the node's own connections (CheckSNATPorts refuses a node whose
	// range reaches them; bpf/nat.h and docs/tc-dataplane.md say why).
	SNATPorts [2]uint16
	// MaglevTableSize is the size of the Maglev tables the control plane
	// writes (maps.Maglev); zero keeps the default, 16381.
	MaglevTableSize uint32
	// MaglevSeed is the cluster's seed of the Maglev flow hash, which
	// the control plane's tables (maps.NewMaglev) must be built with:
	// the same on every node, and secret.
	MaglevSeed uint64
}

// TC is the loaded tc programs.
type TC struct {
	Ingress *ebpf.Program
	Egress  *ebpf.Program
	// Mode is how the programs were attached (TCAttachTCX or
	// TCAttachLegacy); TCAttachAuto when they were not.
	Mode TCAttachMode
	// devices is the programs' set of kpr's devices (by ifindex), which
	// tells a backend on another node from a local one.
	devices *ebpf.Map

	// What SetDevices attaches with.
	bpfRoot string
	netNS   string
	want    TCAttachMode
	log     *zap.Logger
	mu      sync.Mutex
}

// Close releases this process's handles on the programs. Attachments stay.
func (t *TC) Close() error {
	return errors.Join(t.Ingress.Close(), t.Egress.Close(), t.devices.Close())
}

// LoadTC loads the tc programs against l's maps and attaches them to
// opts.Devices, replacing the programs a previous kpr attached there.
// Attachments of kpr's tc programs to devices no longer named are removed.
// l keeps the programs and closes them with its Close.
func (l *Loaded) LoadTC(opts TCOptions, log *zap.Logger) (*TC, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if l.TC != nil {
		return nil, errors.New("the tc programs are already loaded")
	}
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		return nil, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	if err := configureFlows(spec, opts); err != nil {
		return nil, err
	}
	var objs struct {
		Ingress *ebpf.Program `ebpf:"kpr_tc_ingress"`
		Egress  *ebpf.Program `ebpf:"kpr_tc_egress"`
		Devices *ebpf.Map     `ebpf:"kpr_tc_devices"`
	}
	if err := loadAgainstShared(spec, l.sizes, l.shared, l.cache, &objs); err != nil {
		return nil, fmt.Errorf("load tc programs: %w", err)
	}
	if objs.Devices.ValueSize() != tcDeviceSize {
		_ = errors.Join(objs.Ingress.Close(), objs.Egress.Close(), objs.Devices.Close())
		return nil, fmt.Errorf("load tc programs: kpr_tc_devices holds %d-byte values, this kpr writes %d: the embedded object and loader/tcdevice.go disagree (run make generate)",
			objs.Devices.ValueSize(), tcDeviceSize)
	}
	tc := &TC{Ingress: objs.Ingress, Egress: objs.Egress, devices: objs.Devices,
		bpfRoot: l.BPFRoot, netNS: opts.NetNS, want: opts.Mode, log: log}
	if len(opts.Devices) > 0 {
		if err := tc.SetDevices(opts.Devices); err != nil {
			tc.Close()
			return nil, err
		}
	}
	l.TC = tc
	return tc, nil
}

// SetDevices attaches the programs to exactly devices, for a kpr that
// follows the node's devices while it runs: new ones get the programs,
// those no longer named lose them (tcx links and clsact filters alike).
// The attach mode stays the one the first attachment found.
func (t *TC) SetDevices(devices []string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	mode := t.want
	if t.Mode != TCAttachAuto {
		mode = t.Mode
	}
	attach := func() error {
		used, err := attachTC(t.bpfRoot, devices, mode, t, t.log)
		if err != nil {
			return err
		}
		if len(devices) > 0 {
			t.Mode = used
		}
		err = nodeHooks.removeFiltersExcept(devices, t.log)
		// Last: a packet on a device being detached still finds it.
		return errors.Join(err, pruneDevices(t.devices, devices))
	}
	if t.netNS != "" {
		return netnsexec.InPath(t.netNS, attach)
	}
	return attach()
}

// configureFlows sets the constants of a tc object (tc_nodeport.c or
// tc_pod.c) that shape its flows: conntrack timeouts, SNAT ports, Maglev.
// Both objects share the conntrack map, so they must agree; their
// constants have the same names (flow.h, ct.h, nat.h).
func configureFlows(spec *ebpf.CollectionSpec, opts TCOptions) error {
	if err := setTimeouts(spec, opts.Timeouts); err != nil {
		return err
	}
	if err := setSNATPorts(spec, opts.SNATPorts); err != nil {
		return err
	}
	if opts.MaglevTableSize != 0 {
		if err := spec.Variables[bpf.TcNodeportVarMaglevTableSize].Set(opts.MaglevTableSize); err != nil {
			return fmt.Errorf("configure tc programs: %w", err)
		}
	}
	if err := spec.Variables[bpf.TcNodeportVarMaglevSeed].Set(opts.MaglevSeed); err != nil {
		return fmt.Errorf("configure tc programs: %w", err)
	}
	return nil
}

// setTimeouts writes the non-zero timeouts into the object's constants.
func setTimeouts(spec *ebpf.CollectionSpec, t ConntrackTimeouts) error {
	for name, d := range map[string]time.Duration{
		bpf.TcNodeportVarCtTcpSynS:         t.TCPSyn,
		bpf.TcNodeportVarCtTcpEstablishedS: t.TCPEstablished,
		bpf.TcNodeportVarCtTcpFinS:         t.TCPFin,
		bpf.TcNodeportVarCtTcpRstS:         t.TCPRst,
		bpf.TcNodeportVarCtUdpS:            t.UDP,
		bpf.TcNodeportVarCtUdpStreamS:      t.UDPStream,
	} {
		if d == 0 {
			continue
		}
		secs := d / time.Second
		if d < 0 || secs < 1 || secs > 1<<31 {
			return fmt.Errorf("conntrack timeout %s=%s: give a whole number of seconds from 1s to 68 years", name, d)
		}
		if err := spec.Variables[name].Set(uint32(secs)); err != nil {
			return fmt.Errorf("configure tc programs: %w", err)
		}
	}
	return nil
}

func setSNATPorts(spec *ebpf.CollectionSpec, r [2]uint16) error {
	if r == [2]uint16{} {
		return nil
	}
	if r[0] < 1024 || r[1] < r[0] {
		return fmt.Errorf("SNAT port range %d-%d: give first <= last, both from 1024 to 65535", r[0], r[1])
	}
	if err := spec.Variables[bpf.TcNodeportVarSnatPortMin].Set(r[0]); err != nil {
		return fmt.Errorf("configure tc programs: %w", err)
	}
	if err := spec.Variables[bpf.TcNodeportVarSnatPortMax].Set(r[1]); err != nil {
		return fmt.Errorf("configure tc programs: %w", err)
	}
	return nil
}

// loadAgainstShared loads an object other than the hooks' against shared,
// the pinned maps the hooks were loaded with, and assigns its objects to
// objs. Its own maps are created fresh.
func loadAgainstShared(spec *ebpf.CollectionSpec, sizes MapSizes, shared map[string]*ebpf.Map, cache *btf.Cache, objs any) error {
	// A replacement must match its spec's size: size this object's copy
	// of the shared maps as the hooks' object was sized.
	applySizes(spec, sizes)
	replacements := map[string]*ebpf.Map{}
	for _, name := range pinnedIn(spec) {
		m, ok := shared[name]
		if !ok {
			return fmt.Errorf("it uses pinned map %s, which the socket hooks' object lacks; "+
				"every object must take its pinned maps from bpf/maps.h", name)
		}
		replacements[name] = m
	}
	err := spec.LoadAndAssign(objs, &ebpf.CollectionOptions{MapReplacements: replacements, Cache: cache})
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("kernel verifier rejected it: %+w", verr)
	}
	return err
}

// attachTC records every device in the programs' device set, then
// attaches both programs to them in the given mode, and returns the mode
// used.
func attachTC(bpfRoot string, devices []string, mode TCAttachMode, tc *TC, log *zap.Logger) (TCAttachMode, error) {
	ifaces := make([]netlink.Link, 0, len(devices))
	for _, dev := range devices {
		iface, err := netlink.LinkByName(dev)
		if err != nil {
			return mode, fmt.Errorf("find device %s to attach the tc programs to: %w (check --devices)", dev, err)
		}
		if nodeaddrs.Headerless(iface.Attrs()) {
			return mode, fmt.Errorf("device %s has no Ethernet header (hardware type %q), and kpr's tc programs read Ethernet frames: "+
				"leave it out of --devices", dev, iface.Attrs().EncapType)
		}
		// Before any program runs: a packet must never find its own
		// device missing from the set.
		addrs, err := deviceAddresses(iface)
		if err != nil {
			return mode, err
		}
		if err := tc.devices.Put(uint32(iface.Attrs().Index), addrs); err != nil {
			return mode, fmt.Errorf("record device %s for the tc programs: %w", dev, err)
		}
		ifaces = append(ifaces, iface)
	}
	return nodeHooks.attach(bpfRoot, ifaces, mode, tcPrograms{tc.Ingress, tc.Egress}, log)
}

// pruneDevices drops from the programs' device set the ifindexes of
// devices no longer attached: a device created later under a freed index
// must not count as kpr's.
func pruneDevices(set *ebpf.Map, keep []string) error {
	kept := map[uint32]bool{}
	for _, dev := range keep {
		if l, err := netlink.LinkByName(dev); err == nil {
			kept[uint32(l.Attrs().Index)] = true
		}
	}
	var stale []uint32
	var index uint32
	var v tcDevice
	it := set.Iterate()
	for it.Next(&index, &v) {
		if !kept[index] {
			stale = append(stale, index)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read the tc programs' device set: %w", err)
	}
	for _, index := range stale {
		if err := set.Delete(index); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("drop device %d from the tc programs' device set: %w", index, err)
		}
	}
	return nil
}
