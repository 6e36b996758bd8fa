package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/nodeaddrs"
)

// The packet-level programs of bpf/tc_nodeport.c, on the node's external
// devices: ingress translates traffic from other machines to a NodePort,
// ExternalIP or LoadBalancer IP, egress restores the replies.
//
// Each program is attached through tcx (Linux 6.6+) behind a pinned
// bpf_link, or, where the kernel lacks tcx, as a direct-action BPF filter
// on a clsact qdisc. Either way the attachment outlives kpr's process, and
// a later kpr swaps its programs in place: BPF_LINK_UPDATE for a tcx link,
// a filter replace (same priority and handle) for the legacy path.
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
	if err := setTimeouts(spec, opts.Timeouts); err != nil {
		return nil, err
	}
	if err := setSNATPorts(spec, opts.SNATPorts); err != nil {
		return nil, err
	}
	if opts.MaglevTableSize != 0 {
		if err := spec.Variables[bpf.TcNodeportVarMaglevTableSize].Set(opts.MaglevTableSize); err != nil {
			return nil, fmt.Errorf("configure tc programs: %w", err)
		}
	}
	if err := spec.Variables[bpf.TcNodeportVarMaglevSeed].Set(opts.MaglevSeed); err != nil {
		return nil, fmt.Errorf("configure tc programs: %w", err)
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
		// Clsact filters have no pins: those of devices no longer named,
		// by this kpr or by the one before a restart, are found on the
		// devices themselves. Only kpr's filters are touched.
		var errs []error
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list the devices to find kpr's tc filters on those no longer named: %w", err)
		}
		for _, iface := range links {
			dev := iface.Attrs().Name
			if slices.Contains(devices, dev) {
				continue
			}
			for _, d := range tcDirections {
				removed, err := removeLegacyFilterOf(iface, d)
				errs = append(errs, err)
				if removed {
					t.log.Info("tc programs detached from a device no longer followed", zap.String("device", dev), zap.String("direction", d.name))
				}
			}
		}
		// Last: a packet on a device being detached still finds it.
		return errors.Join(append(errs, pruneDevices(t.devices, devices))...)
	}
	if t.netNS != "" {
		return netnsexec.InPath(t.netNS, attach)
	}
	return attach()
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

// tcDirection is one of the two hooks of a device.
type tcDirection struct {
	name   string // in pin names
	tcx    ebpf.AttachType
	parent uint32 // clsact's pseudo-class for legacy filters
	prog   func(*TC) *ebpf.Program
}

var tcDirections = []tcDirection{
	{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, func(t *TC) *ebpf.Program { return t.Ingress }},
	{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, func(t *TC) *ebpf.Program { return t.Egress }},
}

// tcPinPrefix starts the pin of every tcx link kpr makes, so that links of
// devices no longer named can be found.
const tcPinPrefix = "tc-"

func tcPin(bpfRoot, dir, dev string) string {
	return filepath.Join(linkDir(bpfRoot), tcPinPrefix+dir+"-"+dev)
}

// tcPins are the tcx link pins under bpfRoot.
func tcPins(bpfRoot string) []string {
	pins, _ := filepath.Glob(filepath.Join(linkDir(bpfRoot), tcPinPrefix+"*"))
	return pins
}

// tcPinDevice is the device a tcPin names (device names may hold dashes).
func tcPinDevice(pin string) string {
	name := filepath.Base(pin)
	for _, d := range tcDirections {
		if dev, ok := strings.CutPrefix(name, tcPinPrefix+d.name+"-"); ok {
			return dev
		}
	}
	return ""
}

// The legacy filters are told from other tools' by their priority, handle
// and name; the priority is one no other tool is known to use.
const (
	tcFilterPriority = 0x4b50 // "KP"
	tcFilterHandle   = 1
	tcFilterPrefix   = "kpr_tc_"
)

// attachTC attaches both programs to every device, in the given mode, and
// returns the mode used.
func attachTC(bpfRoot string, devices []string, mode TCAttachMode, tc *TC, log *zap.Logger) (TCAttachMode, error) {
	want := map[string]bool{}
	for _, dev := range devices {
		want[dev] = true
	}
	auto := mode == TCAttachAuto
	if auto {
		mode = TCAttachTCX
	}
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
	for _, iface := range ifaces {
		dev := iface.Attrs().Name
		var err error
		for _, d := range tcDirections {
			if mode == TCAttachTCX {
				err = attachTCX(bpfRoot, iface, d, d.prog(tc), log)
				if auto && errors.Is(err, ebpf.ErrNotSupported) {
					// Only the first attachment can fail so: one
					// kernel, one answer.
					log.Info("kernel lacks tcx; attaching the tc programs as clsact filters", zap.Error(err))
					mode = TCAttachLegacy
					err = attachLegacy(iface, d, d.prog(tc))
				}
				if err == nil && mode == TCAttachTCX {
					// A filter a kpr on a kernel without tcx left would
					// translate every packet a second time.
					err = removeLegacyFilter(iface, d)
				}
			} else {
				err = attachLegacy(iface, d, d.prog(tc))
				if err == nil {
					err = removeTCXPin(tcPin(bpfRoot, d.name, dev))
				}
			}
			if err != nil {
				return mode, err
			}
		}
		log.Info("tc programs attached", zap.String("device", dev), zap.Stringer("mode", mode))
	}
	// Devices no longer named lose kpr's programs.
	for _, pin := range tcPins(bpfRoot) {
		if dev := tcPinDevice(pin); !want[dev] {
			if err := removeTCXPin(pin); err != nil {
				return mode, err
			}
			log.Info("tc programs detached from a device no longer named", zap.String("device", dev))
		}
	}
	return mode, nil
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

// attachTCX keeps one pinned tcx link per device and direction. An existing
// link on the same device gets the new program swapped in; a link whose
// device is gone (the pin outlived a device that was recreated under the
// same name) is replaced.
func attachTCX(bpfRoot string, iface netlink.Link, d tcDirection, prog *ebpf.Program, log *zap.Logger) error {
	dev, index := iface.Attrs().Name, iface.Attrs().Index
	pin := tcPin(bpfRoot, d.name, dev)
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer old.Close()
		info, err := old.Info()
		if err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == index {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("swap %s into its tcx link on %s: %w", d.name, dev, err)
			}
			log.Debug("swapped tc program in place", zap.String("device", dev), zap.String("direction", d.name))
			return nil
		}
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale tcx link %s: %w", pin, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned link %s: %w (remove it with `kpr cleanup`)", pin, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: index, Program: prog, Attach: d.tcx})
	if err != nil {
		return fmt.Errorf("attach tc %s program to %s with tcx: %w", d.name, dev, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin tcx link %s: %w", pin, err)
	}
	return nil
}

// detachTCX removes the tcx links a previous kpr pinned, for a kpr started
// without tc programs: the devices it named are no longer named. (Clsact
// filters are not pinned; `kpr cleanup --devices` removes them.)
func detachTCX(bpfRoot string, log *zap.Logger) error {
	for _, pin := range tcPins(bpfRoot) {
		if err := removeTCXPin(pin); err != nil {
			return err
		}
		log.Info("tc programs detached from a device no longer named", zap.String("device", tcPinDevice(pin)))
	}
	return nil
}

// removeTCXPin detaches the tcx link pinned at pin, if any.
func removeTCXPin(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", pin, err)
	}
	return nil
}

// attachLegacy makes sure the device has a clsact qdisc and puts prog in
// kpr's filter there, replacing the one a previous kpr left in one step.
func attachLegacy(iface netlink.Link, d tcDirection, prog *ebpf.Program) error {
	dev := iface.Attrs().Name
	qdisc := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: iface.Attrs().Index,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_CLSACT,
	}}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc to %s: %w", dev, err)
	}
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("tc %s program: %w", d.name, err)
	}
	filter := legacyFilter(iface, d)
	filter.Fd = prog.FD()
	filter.Name = info.Name
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("attach tc %s program to %s as a clsact filter: %w", d.name, dev, err)
	}
	return nil
}

func legacyFilter(iface netlink.Link, d tcDirection) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: iface.Attrs().Index,
			Parent:    d.parent,
			Handle:    tcFilterHandle,
			Priority:  tcFilterPriority,
			Protocol:  unix.ETH_P_ALL,
		},
		DirectAction: true,
	}
}

// removeLegacyFilter deletes kpr's filter in direction d of iface, and the
// clsact qdisc once no filter is left on it.
func removeLegacyFilter(iface netlink.Link, d tcDirection) error {
	_, err := removeLegacyFilterOf(iface, d)
	return err
}

// removeLegacyFilterOf is removeLegacyFilter, also saying whether there
// was a kpr filter to remove.
func removeLegacyFilterOf(iface netlink.Link, d tcDirection) (bool, error) {
	dev := iface.Attrs().Name
	filters, err := netlink.FilterList(iface, d.parent)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return false, nil // no clsact qdisc
		}
		return false, fmt.Errorf("list tc filters of %s: %w", dev, err)
	}
	removed := false
	for _, f := range filters {
		if !isKprFilter(f) {
			continue
		}
		if err := netlink.FilterDel(legacyFilter(iface, d)); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("remove kpr's tc %s filter from %s: %w", d.name, dev, err)
		}
		removed = true
	}
	if !removed {
		return false, nil // another tool's qdisc, or none
	}
	return true, removeEmptyClsact(iface)
}

// isKprFilter reports whether f is kpr's clsact filter.
func isKprFilter(f netlink.Filter) bool {
	bf, ok := f.(*netlink.BpfFilter)
	return ok && bf.Priority == tcFilterPriority && bf.Handle == tcFilterHandle && strings.HasPrefix(bf.Name, tcFilterPrefix)
}

// TCAttachedDevices names the devices kpr's tc programs are attached to:
// those of the tcx links pinned under bpfRoot, and those with kpr's clsact
// filter in the network namespace at netnsPath (this one if empty). It
// only reads.
func TCAttachedDevices(bpfRoot, netnsPath string) ([]string, error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	var devices []string
	for _, pin := range tcPins(bpfRoot) {
		if dev := tcPinDevice(pin); dev != "" && !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
	}
	find := func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list the devices to find kpr's tc filters: %w", err)
		}
		for _, iface := range links {
			for _, d := range tcDirections {
				filters, err := netlink.FilterList(iface, d.parent)
				if err != nil {
					continue // no clsact qdisc
				}
				dev := iface.Attrs().Name
				if slices.ContainsFunc(filters, isKprFilter) && !slices.Contains(devices, dev) {
					devices = append(devices, dev)
				}
			}
		}
		return nil
	}
	if netnsPath == "" {
		return devices, find()
	}
	return devices, netnsexec.InPath(netnsPath, find)
}

// removeEmptyClsact deletes the device's clsact qdisc when neither
// direction holds a filter any more: kpr added it, and leaves none behind.
func removeEmptyClsact(iface netlink.Link) error {
	for _, d := range tcDirections {
		filters, err := netlink.FilterList(iface, d.parent)
		if err != nil {
			return nil // no clsact qdisc
		}
		if len(filters) > 0 {
			return nil
		}
	}
	qdiscs, err := netlink.QdiscList(iface)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", iface.Attrs().Name, err)
	}
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove clsact qdisc of %s: %w", iface.Attrs().Name, err)
			}
		}
	}
	return nil
}

// CleanupTC removes kpr's tc programs from devices in the calling thread's
// network namespace: the tcx links pinned under bpfRoot, and kpr's clsact
// filters (with the qdisc, once empty). Empty devices means every device.
// Cleanup removes the tcx links too, but cannot see the filters. removed
// counts the links and filters that went.
func CleanupTC(bpfRoot string, devices []string) (removed int, err error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	var errs []error
	for _, pin := range tcPins(bpfRoot) {
		if err := removeTCXPin(pin); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	var ifaces []netlink.Link
	if len(devices) == 0 {
		all, err := netlink.LinkList()
		if err != nil {
			return removed, errors.Join(append(errs, fmt.Errorf("list devices: %w", err))...)
		}
		ifaces = all
	}
	for _, dev := range devices {
		iface, err := netlink.LinkByName(dev)
		if err != nil {
			var notFound netlink.LinkNotFoundError
			if !errors.As(err, &notFound) {
				errs = append(errs, fmt.Errorf("find device %s: %w", dev, err))
			}
			continue
		}
		ifaces = append(ifaces, iface)
	}
	for _, iface := range ifaces {
		for _, d := range tcDirections {
			found, err := removeLegacyFilterOf(iface, d)
			if err != nil {
				errs = append(errs, err)
			}
			if found {
				removed++
			}
		}
	}
	return removed, errors.Join(errs...)
}
