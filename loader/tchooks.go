package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/netnsexec"
)

// How kpr's tc programs sit on devices, whichever the programs: those of
// the node's devices (tc.go) and those of the pods' devices (podtc.go) are
// two kinds of attachment, kept apart by their pins and filters, so that
// following one set of devices never touches the other's.
//
// Each program is attached through tcx (Linux 6.6+) behind a pinned
// bpf_link, or, where the kernel lacks tcx, as a direct-action BPF filter
// on a clsact qdisc. Either way the attachment outlives kpr's process, and
// a later kpr swaps its programs in place: BPF_LINK_UPDATE for a tcx link,
// a filter replace (same priority and handle) for the legacy path.

// tcHooks is one kind of kpr's tc attachment.
type tcHooks struct {
	kind string // in logs: "node" or "pod"
	// pinPrefix starts the pin of each of its tcx links, so that links of
	// devices no longer named can be found.
	pinPrefix string
	// Its clsact filters are told from other tools' (and from the other
	// kind's) by their priority, handle and program name; the priorities
	// are ones no other tool is known to use.
	priority   uint16
	namePrefix string
}

var (
	nodeHooks = tcHooks{kind: "node", pinPrefix: "tc-", priority: 0x4b50 /* "KP" */, namePrefix: "kpr_tc_"}
	podHooks  = tcHooks{kind: "pod", pinPrefix: "pod-", priority: 0x4b51, namePrefix: "kpr_pod_"}
)

const tcFilterHandle = 1

// tcDirection is one of the two hooks of a device.
type tcDirection struct {
	name   string // in pin names
	tcx    ebpf.AttachType
	parent uint32 // clsact's pseudo-class for legacy filters
}

// tcDirections are ingress and egress, in the order of a tcPrograms.
var tcDirections = []tcDirection{
	{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS},
	{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS},
}

// tcPrograms are the programs of one kind: ingress, egress.
type tcPrograms [2]*ebpf.Program

func (h tcHooks) pin(bpfRoot, dir, dev string) string {
	return filepath.Join(linkDir(bpfRoot), h.pinPrefix+dir+"-"+dev)
}

// pins are the tcx link pins of this kind under bpfRoot.
func (h tcHooks) pins(bpfRoot string) []string {
	pins, _ := filepath.Glob(filepath.Join(linkDir(bpfRoot), h.pinPrefix+"*"))
	return pins
}

// pinDevice is the device a pin names (device names may hold dashes).
func (h tcHooks) pinDevice(pin string) string {
	name := filepath.Base(pin)
	for _, d := range tcDirections {
		if dev, ok := strings.CutPrefix(name, h.pinPrefix+d.name+"-"); ok {
			return dev
		}
	}
	return ""
}

// pinnedDevices names the devices of this kind's tcx link pins.
func (h tcHooks) pinnedDevices(bpfRoot string) []string {
	var devices []string
	for _, pin := range h.pins(bpfRoot) {
		if dev := h.pinDevice(pin); dev != "" && !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
	}
	return devices
}

// attach attaches progs to every device (in the calling thread's
// namespace), in the given mode, removes this kind's tcx links from the
// devices not named, and returns the mode used.
func (h tcHooks) attach(bpfRoot string, ifaces []netlink.Link, mode TCAttachMode, progs tcPrograms, log *zap.Logger) (TCAttachMode, error) {
	want := map[string]bool{}
	auto := mode == TCAttachAuto
	if auto {
		mode = TCAttachTCX
	}
	for _, iface := range ifaces {
		dev := iface.Attrs().Name
		want[dev] = true
		var err error
		for i, d := range tcDirections {
			if mode == TCAttachTCX {
				err = h.attachTCX(bpfRoot, iface, d, progs[i], log)
				if auto && errors.Is(err, ebpf.ErrNotSupported) {
					// Only the first attachment can fail so: one
					// kernel, one answer.
					log.Info("kernel lacks tcx; attaching the tc programs as clsact filters", zap.String("kind", h.kind), zap.Error(err))
					mode = TCAttachLegacy
					err = h.attachLegacy(iface, d, progs[i])
				}
				if err == nil && mode == TCAttachTCX {
					// A filter a kpr on a kernel without tcx left would
					// translate every packet a second time.
					_, err = h.removeLegacyFilter(iface, d)
				}
			} else {
				err = h.attachLegacy(iface, d, progs[i])
				if err == nil {
					err = removeTCXPin(h.pin(bpfRoot, d.name, dev))
				}
			}
			if err != nil {
				return mode, err
			}
		}
		log.Info("tc programs attached", zap.String("kind", h.kind), zap.String("device", dev), zap.Stringer("mode", mode))
	}
	for _, pin := range h.pins(bpfRoot) {
		if dev := h.pinDevice(pin); !want[dev] {
			if err := removeTCXPin(pin); err != nil {
				return mode, err
			}
			log.Info("tc programs detached from a device no longer named", zap.String("kind", h.kind), zap.String("device", dev))
		}
	}
	return mode, nil
}

// removeFiltersExcept removes this kind's clsact filters from every device
// of the calling thread's namespace but those named. Filters have no pins:
// those of devices no longer named, by this kpr or by the one before a
// restart, are found on the devices themselves.
func (h tcHooks) removeFiltersExcept(devices []string, log *zap.Logger) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list the devices to find kpr's %s tc filters on those no longer named: %w", h.kind, err)
	}
	var errs []error
	for _, iface := range links {
		dev := iface.Attrs().Name
		if slices.Contains(devices, dev) {
			continue
		}
		for _, d := range tcDirections {
			removed, err := h.removeLegacyFilter(iface, d)
			errs = append(errs, err)
			if removed {
				log.Info("tc programs detached from a device no longer followed", zap.String("kind", h.kind), zap.String("device", dev), zap.String("direction", d.name))
			}
		}
	}
	return errors.Join(errs...)
}

// attachTCX keeps one pinned tcx link per device and direction. An existing
// link on the same device gets the new program swapped in; a link whose
// device is gone (the pin outlived a device that was recreated under the
// same name) is replaced.
func (h tcHooks) attachTCX(bpfRoot string, iface netlink.Link, d tcDirection, prog *ebpf.Program, log *zap.Logger) error {
	dev, index := iface.Attrs().Name, iface.Attrs().Index
	pin := h.pin(bpfRoot, d.name, dev)
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		defer old.Close()
		info, err := old.Info()
		if err == nil && info.TCX() != nil && int(info.TCX().Ifindex) == index {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("swap %s into its tcx link on %s: %w", d.name, dev, err)
			}
			log.Debug("swapped tc program in place", zap.String("kind", h.kind), zap.String("device", dev), zap.String("direction", d.name))
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

// detachTCX removes this kind's tcx links pinned under bpfRoot, for a kpr
// started without these programs: the devices it named are no longer
// named. (Clsact filters are not pinned; `kpr cleanup` removes them.)
func (h tcHooks) detachTCX(bpfRoot string, log *zap.Logger) error {
	for _, pin := range h.pins(bpfRoot) {
		if err := removeTCXPin(pin); err != nil {
			return err
		}
		log.Info("tc programs detached from a device no longer named", zap.String("kind", h.kind), zap.String("device", h.pinDevice(pin)))
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
// this kind's filter there, replacing the one a previous kpr left in one
// step.
func (h tcHooks) attachLegacy(iface netlink.Link, d tcDirection, prog *ebpf.Program) error {
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
	filter := h.legacyFilter(iface, d)
	filter.Fd = prog.FD()
	filter.Name = info.Name
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("attach tc %s program to %s as a clsact filter: %w", d.name, dev, err)
	}
	return nil
}

func (h tcHooks) legacyFilter(iface netlink.Link, d tcDirection) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: iface.Attrs().Index,
			Parent:    d.parent,
			Handle:    tcFilterHandle,
			Priority:  h.priority,
			Protocol:  unix.ETH_P_ALL,
		},
		DirectAction: true,
	}
}

// removeLegacyFilter deletes this kind's filter in direction d of iface,
// and the clsact qdisc once no filter is left on it, saying whether there
// was one to remove.
func (h tcHooks) removeLegacyFilter(iface netlink.Link, d tcDirection) (bool, error) {
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
		if !h.owns(f) {
			continue
		}
		if err := netlink.FilterDel(h.legacyFilter(iface, d)); err != nil && !errors.Is(err, unix.ENOENT) {
			return false, fmt.Errorf("remove kpr's tc %s filter from %s: %w", d.name, dev, err)
		}
		removed = true
	}
	if !removed {
		return false, nil // another tool's qdisc, or none
	}
	return true, removeEmptyClsact(iface)
}

// owns reports whether f is this kind's clsact filter.
func (h tcHooks) owns(f netlink.Filter) bool {
	bf, ok := f.(*netlink.BpfFilter)
	return ok && bf.Priority == h.priority && bf.Handle == tcFilterHandle && strings.HasPrefix(bf.Name, h.namePrefix)
}

// attachedDevices names the devices this kind is attached to: those of the
// tcx links pinned under bpfRoot, and those with this kind's clsact filter
// in the network namespace at netnsPath (this one if empty). It only
// reads.
func (h tcHooks) attachedDevices(bpfRoot, netnsPath string) ([]string, error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	devices := h.pinnedDevices(bpfRoot)
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
				if slices.ContainsFunc(filters, h.owns) && !slices.Contains(devices, dev) {
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

// TCAttachedDevices names the node's devices kpr's tc programs are
// attached to (see tcHooks.attachedDevices).
func TCAttachedDevices(bpfRoot, netnsPath string) ([]string, error) {
	return nodeHooks.attachedDevices(bpfRoot, netnsPath)
}

// PodTCAttachedDevices names the pods' devices kpr's pod programs are
// attached to.
func PodTCAttachedDevices(bpfRoot, netnsPath string) ([]string, error) {
	return podHooks.attachedDevices(bpfRoot, netnsPath)
}

// CleanupTC removes kpr's tc programs, of both kinds, from devices in the
// calling thread's network namespace: the tcx links pinned under bpfRoot,
// and kpr's clsact filters (with the qdisc, once empty). Empty devices
// means every device. Cleanup removes the tcx links too, but cannot see
// the filters. removed counts the links and filters that went.
func CleanupTC(bpfRoot string, devices []string) (removed int, err error) {
	if bpfRoot == "" {
		bpfRoot = DefaultBPFRoot
	}
	var errs []error
	var ifaces []netlink.Link
	if len(devices) == 0 {
		all, err := netlink.LinkList()
		if err != nil {
			errs = append(errs, fmt.Errorf("list devices: %w", err))
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
	for _, h := range []tcHooks{nodeHooks, podHooks} {
		for _, pin := range h.pins(bpfRoot) {
			if err := removeTCXPin(pin); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
		for _, iface := range ifaces {
			for _, d := range tcDirections {
				found, err := h.removeLegacyFilter(iface, d)
				if err != nil {
					errs = append(errs, err)
				}
				if found {
					removed++
				}
			}
		}
	}
	return removed, errors.Join(errs...)
}
