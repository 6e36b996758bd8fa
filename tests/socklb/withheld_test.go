package socklb

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/iptables-compat/nftables"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

// kernelMatrixEnv is set by the kernel-matrix VM's init (tests/kernels/init)
// to the kernel release. Tests that change the whole kernel's behaviour run
// only there: on a shared machine they would change it for everyone.
const kernelMatrixEnv = "KPR_KERNEL_MATRIX"

// Offsets in union bpf_attr for BPF_PROG_LOAD (include/uapi/linux/bpf.h),
// stable since the fields were added (expected_attach_type: 4.17).
const (
	attrProgType           = 0
	attrExpectedAttachType = 68
	bpfProgLoad            = 5 // BPF_PROG_LOAD
)

// withholdHook loads a BPF LSM program on the "bpf" hook that refuses, with
// EPERM, every BPF_PROG_LOAD of a cgroup sock_addr program for the given
// attach type, as a hardened node's policy would. Everything else still
// loads, so the rest of kpr's probe finds the kernel as it is. The program
// is assembled here rather than compiled, because it exists only for this
// test.
func withholdHook(t *testing.T, attach ebpf.AttachType) {
	t.Helper()
	const allow = "allow"
	insns := asm.Instructions{
		// r6 = ctx: the hook's arguments as u64s (cmd, attr, size).
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.DWord),
		asm.JNE.Imm(asm.R2, bpfProgLoad, allow),
		// Copy attr->prog_type and attr->expected_attach_type to the stack.
		asm.LoadMem(asm.R7, asm.R6, 8, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R10),
		asm.Add.Imm(asm.R1, -8),
		asm.Mov.Imm(asm.R2, 4),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Add.Imm(asm.R3, attrProgType),
		asm.FnProbeReadKernel.Call(),
		asm.Mov.Reg(asm.R1, asm.R10),
		asm.Add.Imm(asm.R1, -4),
		asm.Mov.Imm(asm.R2, 4),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Add.Imm(asm.R3, attrExpectedAttachType),
		asm.FnProbeReadKernel.Call(),
		asm.LoadMem(asm.R2, asm.R10, -8, asm.Word),
		asm.JNE.Imm(asm.R2, int32(ebpf.CGroupSockAddr), allow),
		asm.LoadMem(asm.R2, asm.R10, -4, asm.Word),
		asm.JNE.Imm(asm.R2, int32(attach), allow),
		asm.Mov.Imm(asm.R0, -int32(unix.EPERM)),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol(allow),
		asm.Return(),
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "kpr_withhold",
		Type:         ebpf.LSM,
		AttachType:   ebpf.AttachLSMMac,
		AttachTo:     "bpf",
		Instructions: insns,
		License:      "GPL",
	})
	if err != nil {
		t.Fatalf("load the BPF LSM program that withholds the hook: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	l, err := link.AttachLSM(link.LSMOptions{Program: prog})
	if err != nil {
		t.Fatalf("attach the BPF LSM program (is bpf in the kernel's lsm= list? /sys/kernel/security/lsm): %v", err)
	}
	t.Cleanup(func() { l.Close() })
}

// loadsCgroupProgram loads a trivial cgroup sock_addr program for attach.
func loadsCgroupProgram(attach ebpf.AttachType) error {
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.CGroupSockAddr,
		AttachType:   attach,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return err
	}
	return p.Close()
}

// bpfLSMActive reports whether the running kernel runs BPF LSM programs,
// from the active LSMs that securityfs lists.
func bpfLSMActive() (bool, error) {
	b, err := os.ReadFile("/sys/kernel/security/lsm")
	if err != nil {
		return false, err
	}
	for _, name := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if name == "bpf" {
			return true, nil
		}
	}
	return false, nil
}

// probeAuto runs `kpr probe -o json` and returns what --mode auto picks.
func probeAuto(t *testing.T) (backend, cause, reason string) {
	t.Helper()
	return probeAutoWith(t, func(cmd *exec.Cmd) ([]byte, error) { return cmd.Output() })
}

// probeAutoWith is probeAuto with the command run by run.
func probeAutoWith(t *testing.T, run func(*exec.Cmd) ([]byte, error)) (backend, cause, reason string) {
	t.Helper()
	out, err := run(exec.Command(kprBinary(t), "probe", "-o", "json"))
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("kpr probe: %v: %s", err, exit.Stderr)
	} else if err != nil {
		t.Fatalf("kpr probe: %v", err)
	}
	var report struct {
		loader.Report
		ModeAuto struct{ Backend, Cause, Reason, Error string } `json:"modeAuto"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		t.Fatalf("kpr probe -o json: %v\n%s", err, out)
	}
	for _, f := range report.Features {
		if f.Name == loader.FeatureConnect {
			t.Logf("kpr probe: %s: supported %v %s", f.Name, f.Supported, f.Error)
		}
	}
	if report.ModeAuto.Error != "" {
		t.Fatalf("--mode auto refuses to start: %s", report.ModeAuto.Error)
	}
	return report.ModeAuto.Backend, report.ModeAuto.Cause, report.ModeAuto.Reason
}

// A node whose policy forbids the connect hooks runs the fallback under
// --mode auto, and says which hook it missed; once the policy is gone, auto
// picks eBPF again. The hook is withheld for real, by a BPF LSM program that
// makes the kernel refuse the program load, so this is the path a hardened
// kernel takes, not a simulated probe result.
func TestAutoModeFallsBackWhenAHookIsWithheld(t *testing.T) {
	harness.RequireRoot(t)
	if os.Getenv(kernelMatrixEnv) == "" {
		t.Skipf("withholding a hook changes the whole kernel, so this test runs only inside the kernel-matrix VMs "+
			"(make test-kernel-oldest, make test-kernels), where %s is set", kernelMatrixEnv)
	}
	active, err := bpfLSMActive()
	if err != nil {
		t.Fatalf("read the active LSMs (the VM's init mounts securityfs): %v", err)
	}
	if !active {
		t.Fatal("the BPF LSM is not active in the kernel-matrix VM: its kernel command line must list bpf in lsm=")
	}
	if major, minor := kernelVersion(t); major < 6 {
		// Seen in the 5.10 VM: the BPF LSM program refused a load in one
		// run and let it through in the next, so the test would prove
		// nothing there. TestAutoModeFallsBackWhereBPFProgramsAreRefused
		// covers the fallback on every kernel.
		t.Skipf("kernel %d.%d: its BPF LSM does not refuse program loads reliably (seen on 5.10); runs on 6.1 and 6.12 (make test-kernels)", major, minor)
	}

	if backend, _, reason := probeAuto(t); backend != "ebpf" {
		t.Fatalf("before the hook is withheld, --mode auto picks %q (%s), want ebpf", backend, reason)
	}

	withholdHook(t, ebpf.AttachCGroupInet4Connect)
	if err := loadsCgroupProgram(ebpf.AttachCGroupInet4Connect); !errors.Is(err, unix.EPERM) {
		t.Fatalf("with the BPF LSM program attached, loading a connect4 program: %v, want EPERM", err)
	}
	if err := loadsCgroupProgram(ebpf.AttachCGroupUDP4Sendmsg); err != nil {
		t.Fatalf("the BPF LSM program withholds more than connect4: loading a sendmsg4 program: %v", err)
	}
	backend, cause, reason := probeAuto(t)
	if err := loadsCgroupProgram(ebpf.AttachCGroupInet4Connect); !errors.Is(err, unix.EPERM) {
		t.Errorf("after kpr probe, loading a connect4 program here: %v, want EPERM still", err)
	}
	if want := autoFallback(); backend != want || cause != "ebpf-unavailable" {
		t.Fatalf("with connect4 withheld, --mode auto picks %q (cause %q, %s), want the %s fallback", backend, cause, reason, want)
	}
	if !strings.Contains(reason, loader.FeatureConnect) {
		t.Fatalf("the fallback's reason does not name the withheld hook %q: %s", loader.FeatureConnect, reason)
	}
	if strings.Contains(reason, loader.FeatureSendmsg) {
		t.Fatalf("the reason names %q, which was not withheld: %s", loader.FeatureSendmsg, reason)
	}
}

// autoFallback is what --mode auto runs here where eBPF cannot run:
// nftables where the kernel (5.13 or later) and nft run it, else iptables.
func autoFallback() string {
	if nftables.Available("") == nil {
		return "nftables"
	}
	return "iptables"
}

// kernelVersion is the running kernel's major and minor version.
func kernelVersion(t *testing.T) (major, minor int) {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("kernel release %q: %v", uts.Release[:], err)
	}
	return major, minor
}

// A node whose policy refuses to load BPF programs at all (a seccomp
// profile that blocks BPF_PROG_LOAD, as hardened runtimes have) runs the
// fallback under --mode auto, and says that it was not permitted to probe
// the hooks rather than that the kernel lacks them. The filter confines
// only the kpr process the test starts, so this runs on any machine.
func TestAutoModeFallsBackWhereBPFProgramsAreRefused(t *testing.T) {
	harness.RequireRoot(t)
	backend, cause, reason := probeAutoWith(t, func(cmd *exec.Cmd) ([]byte, error) {
		return outputUnderSeccomp(cmd, bpfProgLoad)
	})
	if want := autoFallback(); backend != want || cause != "ebpf-unavailable" {
		t.Fatalf("with BPF_PROG_LOAD refused, --mode auto picks %q (cause %q, %s), want the %s fallback", backend, cause, reason, want)
	}
	for _, want := range []string{loader.FeatureConnect, "did not permit"} {
		if !strings.Contains(reason, want) {
			t.Errorf("the fallback's reason does not say %q: %s", want, reason)
		}
	}
}

// outputUnderSeccomp runs cmd with a seccomp filter that makes bpf(2) with
// the given command fail with EPERM. The filter goes on a locked OS thread
// of this process, which then forks the child (filters are inherited); the
// thread is never unlocked, so the Go runtime discards it afterwards and no
// other goroutine runs under the filter.
func outputUnderSeccomp(cmd *exec.Cmd, bpfCmd uint32) ([]byte, error) {
	type result struct {
		out []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		const (
			ldAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
			jeq   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
			ret   = unix.BPF_RET | unix.BPF_K
		)
		// struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its
		// low half on little-endian).
		filter := []unix.SockFilter{
			{Code: ldAbs, K: 4},
			{Code: jeq, K: unix.AUDIT_ARCH_X86_64, Jt: 1},
			{Code: ret, K: unix.SECCOMP_RET_ALLOW},
			{Code: ldAbs, K: 0},
			{Code: jeq, K: unix.SYS_BPF, Jf: 3},
			{Code: ldAbs, K: 16},
			{Code: jeq, K: bpfCmd, Jf: 1},
			{Code: ret, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
			{Code: ret, K: unix.SECCOMP_RET_ALLOW},
		}
		prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			done <- result{err: fmt.Errorf("PR_SET_NO_NEW_PRIVS: %w", err)}
			return
		}
		if _, _, errno := unix.Syscall(unix.SYS_PRCTL, unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog))); errno != 0 {
			done <- result{err: fmt.Errorf("install the seccomp filter: %w", errno)}
			return
		}
		out, err := cmd.Output()
		done <- result{out, err}
	}()
	r := <-done
	return r.out, r.err
}
