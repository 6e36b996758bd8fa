package tcnat

import (
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// tcState is what one device carries, seen from inside its namespace.
type tcState struct {
	tcx     map[string][]ebpf.ProgramID // per direction
	links   []link.ID                   // of the tcx programs
	filters map[string][]string         // BPF filter names per direction (clsact)
	clsact  bool
}

func (s tcState) empty() bool {
	return !s.clsact && len(s.tcx["ingress"])+len(s.tcx["egress"])+len(s.filters["ingress"])+len(s.filters["egress"]) == 0
}

// kernelHasTCX reports whether the kernel has tcx (Linux 6.6+): before it,
// the kernel does not know tcx's attach types and refuses to query them.
var kernelHasTCX = sync.OnceValue(func() bool {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return false
	}
	_, err = link.QueryPrograms(link.QueryOptions{Target: lo.Index, Attach: ebpf.AttachTCXIngress})
	return !errors.Is(err, unix.EINVAL)
})

// skipWithoutTCX skips a test of the tcx attach path on a kernel without
// tcx, where the legacy path is the one that runs.
func skipWithoutTCX(t *testing.T, mode loader.TCAttachMode) {
	t.Helper()
	if mode == loader.TCAttachTCX && !kernelHasTCX() {
		t.Skip("kernel lacks tcx (Linux 6.6+): kpr attaches the tc programs as clsact filters here, which the clsact case tests")
	}
}

func deviceState(t *testing.T, ns *harness.NetNS, dev string) tcState {
	t.Helper()
	s := tcState{tcx: map[string][]ebpf.ProgramID{}, filters: map[string][]string{}}
	err := harness.Do(ns, func() error {
		iface, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		for dir, at := range map[string]ebpf.AttachType{"ingress": ebpf.AttachTCXIngress, "egress": ebpf.AttachTCXEgress} {
			if !kernelHasTCX() {
				break
			}
			res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Attrs().Index, Attach: at})
			if err != nil {
				return err
			}
			for _, p := range res.Programs {
				s.tcx[dir] = append(s.tcx[dir], p.ID)
				if id, ok := p.LinkID(); ok {
					s.links = append(s.links, id)
				}
			}
		}
		slices.Sort(s.links)
		qdiscs, err := netlink.QdiscList(iface)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			s.clsact = s.clsact || q.Type() == "clsact"
		}
		if !s.clsact {
			return nil
		}
		for dir, parent := range map[string]uint32{"ingress": netlink.HANDLE_MIN_INGRESS, "egress": netlink.HANDLE_MIN_EGRESS} {
			filters, err := netlink.FilterList(iface, parent)
			if err != nil {
				return err
			}
			for _, f := range filters {
				name := f.Type()
				if bf, ok := f.(*netlink.BpfFilter); ok {
					name = bf.Name
				}
				s.filters[dir] = append(s.filters[dir], name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read tc state of %s in %s: %v", dev, ns.Name, err)
	}
	return s
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// attachIn loads a dataplane under bpfRoot and attaches its tc programs to
// devices of ns, as a (re)started kpr would.
func attachIn(t *testing.T, ns *harness.NetNS, bpfRoot string, mode loader.TCAttachMode, devices ...string) *loader.TC {
	t.Helper()
	return loadDataplane(t, bpfRoot, &loader.TCOptions{Devices: devices, Mode: mode, NetNS: ns.Path}).TC
}

// checkAttached fails unless dev carries exactly tc's two programs, the way
// mode attaches them.
func checkAttached(t *testing.T, ns *harness.NetNS, dev string, tc *loader.TC, mode loader.TCAttachMode) {
	t.Helper()
	s := deviceState(t, ns, dev)
	switch mode {
	case loader.TCAttachTCX:
		if s.clsact {
			t.Errorf("%s: tcx attachment left a clsact qdisc: %+v", dev, s)
		}
		in, eg := progID(t, tc.Ingress), progID(t, tc.Egress)
		if !slices.Equal(s.tcx["ingress"], []ebpf.ProgramID{in}) || !slices.Equal(s.tcx["egress"], []ebpf.ProgramID{eg}) {
			t.Errorf("%s: tcx programs %v, want ingress [%d] and egress [%d]", dev, s.tcx, in, eg)
		}
	case loader.TCAttachLegacy:
		if len(s.tcx["ingress"])+len(s.tcx["egress"]) != 0 {
			t.Errorf("%s: clsact attachment left tcx programs: %v", dev, s.tcx)
		}
		if !slices.Equal(s.filters["ingress"], []string{"kpr_tc_ingress"}) || !slices.Equal(s.filters["egress"], []string{"kpr_tc_egress"}) {
			t.Errorf("%s: clsact filters %v, want one kpr filter each way", dev, s.filters)
		}
		// The filter runs the program this kpr loaded.
		checkFilterProgs(t, ns, dev, tc)
	}
}

func checkFilterProgs(t *testing.T, ns *harness.NetNS, dev string, tc *loader.TC) {
	t.Helper()
	want := map[uint32]string{netlink.HANDLE_MIN_INGRESS: tc.Ingress.String(), netlink.HANDLE_MIN_EGRESS: tc.Egress.String()}
	ids := map[uint32]ebpf.ProgramID{netlink.HANDLE_MIN_INGRESS: progID(t, tc.Ingress), netlink.HANDLE_MIN_EGRESS: progID(t, tc.Egress)}
	err := harness.Do(ns, func() error {
		iface, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		for parent := range want {
			filters, err := netlink.FilterList(iface, parent)
			if err != nil {
				return err
			}
			for _, f := range filters {
				if bf, ok := f.(*netlink.BpfFilter); ok && ebpf.ProgramID(bf.Id) != ids[parent] {
					t.Errorf("%s: filter runs program %d, want %s (id %d)", dev, bf.Id, want[parent], ids[parent])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Both attach paths work on this kernel: the programs land on the named
// device, a restarted kpr swaps its programs in without a second
// attachment, and CleanupTC leaves no qdisc, filter or tcx link behind.
func TestTCAttachAndCleanup(t *testing.T) {
	for _, mode := range []loader.TCAttachMode{loader.TCAttachTCX, loader.TCAttachLegacy} {
		t.Run(mode.String(), func(t *testing.T) {
			skipWithoutTCX(t, mode)
			node, err := harness.NewNode(t, harness.Options{})
			if err != nil {
				t.Fatal(err)
			}
			bpfRoot := newBPFRoot(t)
			dev := node.Uplink
			first := attachIn(t, node.NetNS, bpfRoot, mode, dev)
			if first.Mode != mode {
				t.Fatalf("attached with %s, asked for %s", first.Mode, mode)
			}
			checkAttached(t, node.NetNS, dev, first, mode)
			checkAttachedDevices(t, bpfRoot, node.NetNS, dev)
			// A restart: a new kpr adopts the pins and swaps its programs in
			// (tcx: into the same links).
			before := deviceState(t, node.NetNS, dev)
			second := attachIn(t, node.NetNS, bpfRoot, mode, dev)
			checkAttached(t, node.NetNS, dev, second, mode)
			if after := deviceState(t, node.NetNS, dev); !slices.Equal(before.links, after.links) {
				t.Errorf("the restart replaced the tcx links %v with %v instead of swapping programs in", before.links, after.links)
			}
			if progID(t, first.Ingress) == progID(t, second.Ingress) {
				t.Fatal("the restarted kpr reused the first one's program: the swap is not shown")
			}
			if err := harness.Do(node.NetNS, func() error { _, err := loader.CleanupTC(bpfRoot, nil); return err }); err != nil {
				t.Fatal(err)
			}
			if s := deviceState(t, node.NetNS, dev); !s.empty() {
				t.Errorf("after cleanup %s still carries %+v", dev, s)
			}
			checkAttachedDevices(t, bpfRoot, node.NetNS)
		})
	}
}

// checkAttachedDevices fails unless loader.TCAttachedDevices, which `kpr
// status` reads, names exactly want.
func checkAttachedDevices(t *testing.T, bpfRoot string, ns *harness.NetNS, want ...string) {
	t.Helper()
	got, err := loader.TCAttachedDevices(bpfRoot, ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Errorf("TCAttachedDevices = %v, want %v", got, want)
	}
}

// The automatic mode picks tcx where the kernel has it and clsact where
// not; changing mode moves the programs over without leaving the other kind
// behind, and a device no longer named loses them.
func TestTCAttachSwitchesModeAndFollowsDevices(t *testing.T) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bpfRoot := newBPFRoot(t)
	dev := node.Uplink
	auto := loader.TCAttachLegacy
	if kernelHasTCX() {
		auto = loader.TCAttachTCX
	}
	tc := attachIn(t, node.NetNS, bpfRoot, loader.TCAttachAuto, dev)
	if tc.Mode != auto {
		t.Fatalf("auto mode attached with %s, want %s on this kernel", tc.Mode, auto)
	}
	checkAttached(t, node.NetNS, dev, tc, auto)
	tc = attachIn(t, node.NetNS, bpfRoot, loader.TCAttachLegacy, dev)
	checkAttached(t, node.NetNS, dev, tc, loader.TCAttachLegacy)
	tc = attachIn(t, node.NetNS, bpfRoot, loader.TCAttachAuto, dev)
	checkAttached(t, node.NetNS, dev, tc, auto)

	// The uplink's peer stands in for a second device.
	other := dev + "-wire"
	tc = attachIn(t, node.NetNS, bpfRoot, loader.TCAttachAuto, other)
	checkAttached(t, node.NetNS, other, tc, auto)
	if s := deviceState(t, node.NetNS, dev); !s.empty() {
		t.Errorf("%s is no longer named but still carries %+v", dev, s)
	}
	// Cleanup alone (the pins) detaches tcx links too; clsact filters,
	// which have no pins, `kpr cleanup` finds on the devices.
	if err := loader.Cleanup(bpfRoot); err != nil {
		t.Fatal(err)
	}
	if auto == loader.TCAttachLegacy {
		if err := harness.Do(node.NetNS, func() error { _, err := loader.CleanupTC(bpfRoot, nil); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if s := deviceState(t, node.NetNS, other); !s.empty() {
		t.Errorf("after Cleanup %s still carries %+v", other, s)
	}
}

// A device that does not exist is an error that names it.
func TestTCAttachUnknownDevice(t *testing.T) {
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	loaded := loadDataplane(t, newBPFRoot(t), nil)
	err = harness.Do(node.NetNS, func() error {
		_, err := loaded.LoadTC(loader.TCOptions{Devices: []string{"nosuchdev0"}}, nil)
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "nosuchdev0") {
		t.Errorf("attach to a missing device: %v, want an error naming it", err)
	}
}

// A kpr started without tc programs takes the previous one's off the
// devices: the operator no longer names them.
func TestLoadWithoutTCDetachesThePreviousOnes(t *testing.T) {
	if !kernelHasTCX() {
		t.Skip("kernel lacks tcx (Linux 6.6+): the programs are clsact filters, which have no pins, so a kpr started without " +
			"tc programs does not know where to look; `kpr cleanup` removes them (TestCleanupCommandFindsTheDevices)")
	}
	node, err := harness.NewNode(t, harness.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bpfRoot := newBPFRoot(t)
	attachIn(t, node.NetNS, bpfRoot, loader.TCAttachAuto, node.Uplink)
	if s := deviceState(t, node.NetNS, node.Uplink); s.empty() {
		t.Fatal("nothing attached")
	}
	loadDataplane(t, bpfRoot, nil)
	if s := deviceState(t, node.NetNS, node.Uplink); !s.empty() {
		t.Errorf("a kpr without --devices left %+v on %s", s, node.Uplink)
	}
}
