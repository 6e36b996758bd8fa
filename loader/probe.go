package loader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
)

// Feature names in a Report.
const (
	FeatureConnect            = "cgroup connect4/6 hooks"
	FeatureSendmsg            = "cgroup sendmsg4/6 hooks"
	FeatureRecvmsg            = "cgroup recvmsg4/6 hooks"
	FeatureGetpeername        = "cgroup getpeername4/6 hooks"
	FeatureSockRelease        = "cgroup sock_release hook"
	FeatureCgroupLink         = "bpf_link for cgroup programs"
	FeatureNetnsCookie        = "bpf_get_netns_cookie helper"
	FeatureSocketCookie       = "bpf_get_socket_cookie helper"
	FeatureSetRetval          = "bpf_set_retval helper"
	FeatureLRUHash            = "LRU hash maps"
	FeatureNoPrealloc         = "BPF_F_NO_PREALLOC hash maps"
	FeatureBatchOps           = "batch map operations"
	FeatureUDPSockTerm        = "UDP socket termination (iter/udp, bpf_sock_destroy)"
	FeatureNetnsCookieSockopt = "SO_NETNS_COOKIE socket option"
	FeatureTaskHelpers        = "current task helpers in socket hooks"

	// The tc programs' features, for traffic from other machines.
	FeatureTCX           = "tcx attachment of tc programs"
	FeatureClsact        = "clsact qdisc with BPF filters"
	FeatureFibLookup     = "bpf_fib_lookup helper"
	FeatureFibLookupSrc  = "BPF_FIB_LOOKUP_SRC flag of bpf_fib_lookup"
	FeatureRedirect      = "bpf_redirect helper"
	FeatureRedirectNeigh = "bpf_redirect_neigh helper"
)

// Feature is one probed kernel capability.
type Feature struct {
	Name      string `json:"name"`
	Supported bool   `json:"supported"`
	// Impact says what kpr does without it.
	Impact string `json:"impact,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Report is what this kernel supports, as kpr needs it.
type Report struct {
	Kernel   string    `json:"kernel"`
	Features []Feature `json:"features"`
}

// Add records a probed feature: err is why it is missing, nil if it is
// there; impact says what kpr does without it. The netfilter modes add
// their own features (IPVS) to the eBPF ones Probe finds.
func (r *Report) Add(name, impact string, err error) {
	f := Feature{Name: name, Supported: err == nil}
	if err != nil {
		f.Impact = impact
		f.Error = err.Error()
	}
	r.Features = append(r.Features, f)
}

// set records a feature's result after the fact, e.g. when loading the
// real program failed although the probe passed.
func (r *Report) set(name string, err error) {
	for i := range r.Features {
		if r.Features[i].Name == name {
			r.Features[i].Supported = err == nil
			if err != nil {
				r.Features[i].Error = err.Error()
			}
		}
	}
}

// errorOf is why the named feature is missing.
func (r Report) errorOf(name string) string {
	for _, f := range r.Features {
		if f.Name == name {
			return f.Error
		}
	}
	return "not probed"
}

// Has reports whether the named feature was found.
func (r Report) Has(name string) bool {
	for _, f := range r.Features {
		if f.Name == name {
			return f.Supported
		}
	}
	return false
}

// requiredForSocketLB are the features without which kpr's eBPF mode cannot
// translate Services correctly.
var requiredForSocketLB = []string{FeatureConnect, FeatureSendmsg, FeatureRecvmsg,
	FeatureSocketCookie, FeatureNetnsCookie, FeatureLRUHash, FeatureNoPrealloc, FeatureCgroupLink}

// RequireSocketLB returns an error naming every missing required feature.
// Features that the kernel refused to let kpr probe are named apart: a
// process without the privilege sees every feature as missing, and being
// told to upgrade the kernel would send its operator the wrong way.
func (r Report) RequireSocketLB() error {
	var missing, denied []string
	for _, name := range requiredForSocketLB {
		switch {
		case r.Has(name):
		case permissionDenied(r.errorOf(name)):
			denied = append(denied, name)
		default:
			missing = append(missing, name)
		}
	}
	var problems []string
	if len(denied) > 0 {
		problems = append(problems, fmt.Sprintf("the kernel did not permit kpr to probe %s: run kpr as root (or with CAP_BPF, "+
			"CAP_NET_ADMIN and CAP_SYS_ADMIN), without a seccomp profile that blocks bpf(), and on Linux before 5.11 "+
			"with a locked-memory limit high enough for BPF maps (ulimit -l unlimited)", strings.Join(denied, ", ")))
	}
	if len(missing) > 0 {
		problems = append(problems, fmt.Sprintf("kernel %s lacks %s, which kpr's eBPF mode needs (Linux 5.8 or later has them)",
			r.Kernel, strings.Join(missing, ", ")))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// Denied are the features whose probe the kernel refused (EPERM, EACCES)
// rather than lacked: every one that loads a program or map, for a
// process without the privilege to.
func (r Report) Denied() []Feature {
	var denied []Feature
	for _, f := range r.Features {
		if !f.Supported && permissionDenied(f.Error) {
			denied = append(denied, f)
		}
	}
	return denied
}

// KernelRelease is the running kernel's release, as uname -r prints it.
func KernelRelease() string {
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	return unix.ByteSliceToString(uts.Release[:])
}

// permissionDenied tells, from a probe's error text, whether the kernel
// refused the probe (EPERM, EACCES) rather than lacked the feature.
func permissionDenied(probeErr string) bool {
	return strings.Contains(probeErr, unix.EPERM.Error()) || strings.Contains(probeErr, unix.EACCES.Error())
}

// Probe checks the running kernel. It loads small throw-away programs and
// maps; it attaches nothing anywhere but a cgroup it creates and removes.
func Probe() Report {
	r := Report{Kernel: KernelRelease()}
	add := r.Add

	add(FeatureConnect, "required: no socket-level load balancing",
		probeHooks(ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect))
	add(FeatureSendmsg, "required: unconnected UDP to a Service is not translated",
		probeHooks(ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg))
	add(FeatureRecvmsg, "required: UDP replies would come from the backend, not the Service",
		probeHooks(ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCGroupUDP6Recvmsg))
	add(FeatureGetpeername, "getpeername() on a connected socket shows the backend instead of the Service",
		probeHooks(ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername))
	add(FeatureSockRelease, "per-socket reverse entries are only aged out of the LRU map, not freed on close",
		probeSockRelease())
	add(FeatureSocketCookie, "required: UDP backend choice and reverse translation need it",
		features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetSocketCookie))
	add(FeatureNetnsCookie, "required: session affinity identifies clients by network namespace",
		features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetNetnsCookie))
	add(FeatureSetRetval, "a connect to a Service without endpoints fails with EPERM instead of ECONNREFUSED",
		features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval))
	add(FeatureLRUHash, "required: per-socket and affinity maps are LRU",
		features.HaveMapType(ebpf.LRUHash))
	add(FeatureNoPrealloc, "required: service maps are allocated on use",
		features.HaveMapFlag(features.BPF_F_NO_PREALLOC))
	add(FeatureBatchOps, "bulk map loads fall back to one syscall per entry", probeBatch())
	add(FeatureCgroupLink, "required: programs could not be pinned, so they would die with the process",
		probeCgroupLink())
	add(FeatureUDPSockTerm, "a connected UDP socket keeps sending to a removed backend until the application reconnects (Linux 6.5+)",
		probeSockTerm())
	add(FeatureTaskHelpers, "kpr trace shows no pid and comm of the client",
		errors.Join(features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetCurrentPidTgid),
			features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetCurrentComm)))
	_, err := NetNSCookie(OwnNetNS)
	add(FeatureNetnsCookieSockopt, "the host network namespace cannot be told apart, so NodePorts on 127.0.0.1 and ::1 are not served (Linux 5.14+)", err)

	add(FeatureTCX, "the tc programs attach as clsact filters instead (tcx is Linux 6.6+)", probeTCX())
	add(FeatureClsact, "without tcx as well, the tc programs cannot attach: NodePorts are not served to other machines", probeClsact())
	add(FeatureFibLookup, "the tc programs cannot load: NodePorts are not served to other machines",
		features.HaveProgramHelper(ebpf.SchedCLS, asm.FnFibLookup))
	add(FeatureFibLookupSrc, "flows to a backend on another node are SNATed to the first address of the device they leave by, not the route's preferred source (Linux 6.7+)",
		probeFibLookupSrc())
	add(FeatureRedirect, "the tc programs cannot load: NodePorts are not served to other machines",
		features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirect))
	add(FeatureRedirectNeigh, "the tc programs cannot load: NodePorts are not served to other machines (Linux 5.10+)",
		features.HaveProgramHelper(ebpf.SchedCLS, asm.FnRedirectNeigh))
	return r
}

// minimalProgram returns a program that allows every call.
func minimalProgram(typ ebpf.ProgramType, attach ebpf.AttachType) (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         typ,
		AttachType:   attach,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "GPL",
	})
}

// probeHooks loads a trivial program per attach type: the kernel refuses
// attach types it does not know.
func probeHooks(types ...ebpf.AttachType) error {
	for _, t := range types {
		p, err := minimalProgram(ebpf.CGroupSockAddr, t)
		if err != nil {
			return fmt.Errorf("load program for attach type %s: %w", t, err)
		}
		p.Close()
	}
	return nil
}

func probeSockRelease() error {
	p, err := minimalProgram(ebpf.CGroupSock, ebpf.AttachCgroupInetSockRelease)
	if err != nil {
		return err
	}
	return p.Close()
}

// probeSockTerm loads kpr's real socket-termination iterator against small
// throw-away maps: that needs the iter/udp target, the bpf_sock_destroy
// kfunc and kernel BTF for the CO-RE relocations.
func probeSockTerm() error {
	spec, err := bpf.LoadSockTerm()
	if err != nil {
		return err
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
		if m.MaxEntries > 16 {
			m.MaxEntries = 16
		}
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"kpr_sock_term_udp"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return err
	}
	return objs.Prog.Close()
}

func probeBatch() error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		return err
	}
	defer m.Close()
	_, err = m.BatchUpdate([]uint32{1}, []uint32{1}, nil)
	return err
}

// probeCgroupLink attaches a do-nothing program to a fresh, empty cgroup and
// checks that the result is a real bpf_link (only those report Info).
func probeCgroupLink() error {
	dir, created, err := probeCgroup()
	if err != nil {
		return err
	}
	if created {
		defer os.Remove(dir)
	}
	p, err := minimalProgram(ebpf.CGroupSockAddr, ebpf.AttachCGroupInet4Connect)
	if err != nil {
		return err
	}
	defer p.Close()
	l, err := link.AttachCgroup(link.CgroupOptions{Path: dir, Attach: ebpf.AttachCGroupInet4Connect, Program: p})
	if err != nil {
		return err
	}
	defer l.Close()
	if _, err := l.Info(); err != nil {
		return fmt.Errorf("attached with legacy PROG_ATTACH only: %w", err)
	}
	return nil
}

// probeCgroup returns a cgroup for a probe to attach to, and whether it
// created it (and the caller removes it). It creates one under the first
// cgroup2 mount that takes it. In kpr's pod none does: the container's own
// /sys/fs/cgroup is read-only, and the root of the node's hierarchy (the
// chart's /run/kpr/cgroupv2) is mode 0555, writable only with
// CAP_DAC_OVERRIDE, which kpr does not need otherwise. There the probe
// uses the process's own cgroup, the container's: the probe's program
// allows every connect, and only kpr's own sockets pass through it.
func probeCgroup() (dir string, created bool, err error) {
	roots, err := cgroup2Mounts()
	if err != nil {
		return "", false, err
	}
	if len(roots) == 0 {
		return "", false, errors.New("cgroup2 is not mounted")
	}
	var errs []error
	for _, root := range roots {
		dir, err := os.MkdirTemp(root, "kpr-probe-")
		if err == nil {
			return dir, true, nil
		}
		errs = append(errs, err)
	}
	own, err := ownCgroup()
	if err != nil {
		errs = append(errs, err)
		return "", false, fmt.Errorf("create probe cgroup: %w", errors.Join(errs...))
	}
	return own, false, nil
}

// probeTCX asks the kernel for a tcx link on an interface that cannot
// exist: a kernel with tcx answers ENODEV, one without it (before 6.6)
// does not know the attach type.
func probeTCX() error {
	p, err := minimalProgram(ebpf.SchedCLS, ebpf.AttachNone)
	if err != nil {
		return err
	}
	defer p.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: int(^uint32(0) >> 1), Program: p, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return nil
	}
	if errors.Is(err, unix.ENODEV) {
		return nil
	}
	return err
}

// probeClsact adds a clsact qdisc and a direct-action BPF filter to the
// loopback device of a network namespace made for the probe, which dies
// once the probe's thread has left it: no device of the node is touched.
//
// The thread goes back to its own namespace before it is unlocked, rather
// than being left for the runtime to end: the runtime cannot end the main
// thread, and a main thread parked in the probe's namespace makes
// /proc/self/ns/net, which names the node's namespace for the netfilter
// modes' records, point at a dead one.
func probeClsact() error {
	p, err := minimalProgram(ebpf.SchedCLS, ebpf.AttachNone)
	if err != nil {
		return err
	}
	defer p.Close()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("open this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("create a network namespace to probe in: %w", err)
			return
		}
		probeErr := attachInFreshNamespace(p)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Still in the probe's namespace: stay locked, so that the
			// runtime ends this thread instead of reusing it.
			done <- errors.Join(probeErr, fmt.Errorf("return from the probe's network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		done <- probeErr
	}()
	return <-done
}

// attachInFreshNamespace is probeClsact's attach, on a thread inside the
// namespace made for it.
func attachInFreshNamespace(p *ebpf.Program) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in the probe's namespace: %w", err)
	}
	return nodeHooks.attachLegacy(lo, tcDirections[0], p)
}

// probeFibLookupSrc runs a program that calls bpf_fib_lookup with
// BPF_FIB_LOOKUP_SRC and no address family: a kernel that knows the flag
// (6.7+) refuses the family (EAFNOSUPPORT), one that does not refuses the
// flag (EINVAL) first.
func probeFibLookupSrc() error {
	const (
		paramsSize       = 64 // struct bpf_fib_lookup
		fibLookupSrc     = 1 << 4
		fibLookupSkipNbr = 1 << 2
	)
	ins := asm.Instructions{asm.Mov.Reg(asm.R6, asm.R1), asm.Mov.Imm(asm.R0, 0)}
	for off := int16(-paramsSize); off < 0; off += 8 {
		ins = append(ins, asm.StoreMem(asm.RFP, off, asm.R0, asm.DWord))
	}
	ins = append(ins,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -paramsSize),
		asm.Mov.Imm(asm.R3, paramsSize),
		// The flags the tc programs pass.
		asm.Mov.Imm(asm.R4, fibLookupSrc|fibLookupSkipNbr),
		asm.FnFibLookup.Call(),
		asm.Return(),
	)
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: ins, License: "GPL"})
	if err != nil {
		return fmt.Errorf("load bpf_fib_lookup probe: %w", err)
	}
	defer p.Close()
	// An Ethernet header and a zero IPv4 header.
	pkt := make([]byte, 14+20)
	binary.BigEndian.PutUint16(pkt[12:], unix.ETH_P_IP)
	pkt[14] = 0x45
	ret, err := p.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		return fmt.Errorf("run bpf_fib_lookup probe: %w", err)
	}
	switch errno := unix.Errno(-int32(ret)); errno {
	case unix.EAFNOSUPPORT:
		return nil
	case unix.EINVAL:
		return fmt.Errorf("bpf_fib_lookup refuses the flag: %w", ebpf.ErrNotSupported)
	default:
		return fmt.Errorf("bpf_fib_lookup probe returned %d, want -EAFNOSUPPORT or -EINVAL", int32(ret))
	}
}
