package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kpr-io/kpr/socketlb"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// A service-mesh pod under --socket-lb per-pod: Istio's init container
// redirects the pod's outbound TCP to the sidecar's port 15001 with an
// iptables REDIRECT in the pod's namespace, and the sidecar reads the
// original destination (SO_ORIGINAL_DST) to route by Service. With the
// socket hooks translating in connect(), the redirect never matches the
// ClusterIP and the sidecar is skipped; a bypassed pod keeps the
// ClusterIP, and the sidecar sees it.
//
// The pod is a real Pod object bound to the node, and a real process in
// a cgroup named as the kubelet names a pod's, in the pod's network
// namespace: kpr finds the namespace as it does on a node.
func TestPerPodSocketLBLeavesAMeshPodItsClusterIP(t *testing.T) {
	f, ns, _, vip := perPodWeb(t, "mesh")

	mesh, err := f.node.AddPod("mesh")
	if err != nil {
		t.Fatal(err)
	}
	startSidecar(t, mesh.NetNS, vip)

	// The Pod, injected but kept with the socket hooks by kpr's own
	// annotation: the sidecar is skipped, as it is under every socket
	// LB today.
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "mesh", Namespace: ns, Annotations: map[string]string{
			"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`,
			socketlb.Annotation:       socketlb.AnnotationServe,
		}},
		Spec: v1.PodSpec{NodeName: nodeName, Containers: []v1.Container{{Name: "app", Image: "app"}}},
	}
	pod, err = f.client.CoreV1().Pods(ns).Create(f.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podProcess(t, f.cgroup.Path, pod.UID, mesh.NetNS)
	waitUntil(t, convergeTimeout, "the served mesh pod reaches a backend", func() error {
		got, err := askThroughSidecar(mesh.NetNS, vip)
		if err != nil || (got != "pod-a" && got != "pod-b") {
			return fmt.Errorf("got %q, %v; want a backend's greeting", got, err)
		}
		return nil
	})

	// Without kpr's annotation the sidecar's mark decides: bypassed.
	setAnnotation(t, f, pod, socketlb.Annotation, "")
	waitUntil(t, convergeTimeout, "the mesh pod's sidecar sees the ClusterIP", func() error {
		got, err := askThroughSidecar(mesh.NetNS, vip)
		if err != nil || got != "sidecar saw "+vip.String() {
			return fmt.Errorf("got %q, %v; want the sidecar's %q", got, err, "sidecar saw "+vip.String())
		}
		return nil
	})
	if v, err := f.kpr.Metric(`kpr_sock_bypasses_total{hook="connect4"}`); err != nil || v == "0" {
		t.Errorf("kpr_sock_bypasses_total{hook=connect4} = %q, %v; want the bypassed connects counted", v, err)
	}
	// The node's own sockets are still translated.
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
	if log := f.kpr.Log(); !strings.Contains(log, "Istio sidecar injected") {
		t.Errorf("kpr's log does not say why the pod is bypassed:\n%s", lastLines(log, 30))
	}
	out, _ := f.kprStatus(t, "--metrics-address", f.kpr.MetricsAddr)
	for _, want := range []string{"--socket-lb per-pod, bypassed pods: 1", ns + "/mesh (mesh: Istio sidecar injected"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("kpr status lacks %q:\n%s", want, out)
		}
	}

	// The Pod deleted: its namespace is served again.
	if err := f.client.CoreV1().Pods(ns).Delete(f.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, convergeTimeout, "the deleted pod's namespace is served by the socket hooks again", func() error {
		got, err := askThroughSidecar(mesh.NetNS, vip)
		if err != nil || (got != "pod-a" && got != "pod-b") {
			return fmt.Errorf("got %q, %v; want a backend's greeting", got, err)
		}
		return nil
	})
}

// A pod that the socket hooks leave alone (kpr's annotation bypass, as for
// a VM or a sandbox) reaches Services through the packet path kpr puts on
// its veth: TCP and UDP, from the Service address, and a Service without
// endpoints refuses it at once. Its annotation removed, the hooks serve
// it again and the programs leave its veth.
func TestPerPodBypassedPodReachesServicesOnThePacketPath(t *testing.T) {
	f := newFixture(t, "--socket-lb", "per-pod")
	ns := f.namespace(t, "vm")
	dnsPort := kubeobj.Port{Name: "dns", Port: 53, TargetPort: int32(udpPort), Protocol: v1.ProtocolUDP}
	web := f.createService(t, kubeobj.Service(ns, "web", tcp80, dnsPort))
	f.setEndpoints(t, web, v4, f.eps("pod-a", "pod-b")...)
	empty := f.createService(t, kubeobj.Service(ns, "empty", tcp80))
	vip, dns := clusterIP(t, web, v1.IPv4Protocol, 80), clusterIP(t, web, v1.IPv4Protocol, 53)
	none := clusterIP(t, empty, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")

	vm, err := f.node.AddPod("vm")
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns, Annotations: map[string]string{socketlb.Annotation: socketlb.AnnotationBypass}},
		Spec:       v1.PodSpec{NodeName: nodeName, Containers: []v1.Container{{Name: "guest", Image: "guest"}}},
	}
	pod, err = f.client.CoreV1().Pods(ns).Create(f.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podProcess(t, f.cgroup.Path, pod.UID, vm.NetNS)
	waitUntil(t, convergeTimeout, "kpr puts the packet path on the bypassed pod's veth", func() error {
		out, _ := f.kprStatus(t, "--metrics-address", f.kpr.MetricsAddr)
		if want := ns + "/vm (annotation: annotation " + socketlb.Annotation + ": bypass), packet path on " + vm.HostVeth; !strings.Contains(string(out), want) {
			return fmt.Errorf("kpr status lacks %q:\n%s", want, out)
		}
		return nil
	})
	waitServes(t, tcpWho, vm.NetNS, vip, "pod-a", "pod-b")
	waitServes(t, udpWho, vm.NetNS, dns, "pod-a", "pod-b")
	for _, series := range []string{`kpr_sock_bypasses_total{hook="connect4"}`, `kpr_tc_translations_total{direction="forward"}`} {
		if v, err := f.kpr.Metric(series); err != nil || v == "0" {
			t.Errorf("%s = %q, %v; want the bypassed pod's connections counted", series, v, err)
		}
	}
	began := time.Now()
	_, err = harness.DialTCP(vm.NetNS, none, dialTimeout)
	if !errors.Is(err, unix.ECONNREFUSED) || time.Since(began) > time.Second {
		t.Errorf("TCP to %s, a Service without endpoints, from the bypassed pod: %v after %s; want refused at once", none, err, time.Since(began))
	}
	if v, err := f.kpr.Metric(`kpr_tc_rejected_total`); err != nil || v == "0" {
		t.Errorf("kpr_tc_rejected_total = %q, %v; want the refusal counted", v, err)
	}
	trace := traceOne(t, f, vip, func() {
		if _, err := tcpWho(vm.NetNS, vip); err != nil {
			t.Error(err)
		}
	})
	if want := vip.String() + " bypassed (left to the packet path on the pod's veth)"; !strings.Contains(trace, want) {
		t.Errorf("kpr trace of the bypassed pod's connect lacks %q:\n%s", want, trace)
	}
	explainPod := func() string {
		return string(f.kprCommand(t, "explain", "--pod", ns+"/vm", "--kubeconfig", f.cluster.KubeconfigPath, "--hostname-override", nodeName,
			"--host-netns", f.node.NetNS.Path, "--socket-lb", "per-pod", "--cgroup-root", f.cgroup.Path))
	}
	out := explainPod()
	for _, want := range []string{"Pod " + ns + "/vm reaches Services through the packet path: annotation " + socketlb.Annotation + ": bypass",
		"listed in kpr_sock_bypass; packet path programs on " + vm.HostVeth} {
		if !strings.Contains(out, want) || strings.Contains(out, "DIVERGENCE") {
			t.Errorf("kpr explain --pod lacks %q, or names a divergence:\n%s", want, out)
		}
	}

	setAnnotation(t, f, pod, socketlb.Annotation, "")
	waitUntil(t, convergeTimeout, "the packet path leaves the pod served by the hooks again", func() error {
		out, _ := f.kprStatus(t, "--metrics-address", f.kpr.MetricsAddr)
		if want := "bypassed pods: 0, packet path on 0 pod devices"; !strings.Contains(string(out), want) {
			return fmt.Errorf("kpr status lacks %q:\n%s", want, out)
		}
		return nil
	})
	requireServes(t, tcpWho, vm.NetNS, vip, "pod-a", "pod-b")
	out = explainPod()
	for _, want := range []string{"through the socket hooks: served by the socket hooks", "not listed in kpr_sock_bypass; packet path programs on none"} {
		if !strings.Contains(out, want) || strings.Contains(out, "DIVERGENCE") {
			t.Errorf("kpr explain --pod lacks %q, or names a divergence:\n%s", want, out)
		}
	}
}

// bypassedPod adds a pod whose Pod object asks to bypass the socket hooks
// (kpr's annotation), with a process as the kubelet would start it, and
// waits until kpr has put the packet path on its veth and listed it.
func (f *fixture) bypassedPod(t *testing.T, name string) *harness.Pod {
	t.Helper()
	pod, err := f.node.AddPod(name)
	if err != nil {
		t.Fatal(err)
	}
	ns := f.namespace(t, "bypassed-"+name)
	obj := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{socketlb.Annotation: socketlb.AnnotationBypass}},
		Spec:       v1.PodSpec{NodeName: nodeName, Containers: []v1.Container{{Name: "guest", Image: "guest"}}},
	}
	obj, err = f.client.CoreV1().Pods(ns).Create(f.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podProcess(t, f.cgroup.Path, obj.UID, pod.NetNS)
	waitUntil(t, convergeTimeout, "kpr puts the packet path on the bypassed pod's veth", func() error {
		out, _ := f.kprStatus(t, "--metrics-address", f.kpr.MetricsAddr)
		if want := ns + "/" + name + " (annotation: annotation " + socketlb.Annotation + ": bypass), packet path on " + pod.HostVeth; !strings.Contains(string(out), want) {
			return fmt.Errorf("kpr status lacks %q:\n%s", want, out)
		}
		return nil
	})
	return pod
}

// traceOne runs `kpr trace --frontend fe --count 1` around do, and
// returns the decision it printed.
func traceOne(t *testing.T, f *fixture, fe netip.AddrPort, do func()) string {
	t.Helper()
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "trace", "--frontend", fe.String(), "--count", "1", "--bpf-root", f.kpr.BPFRoot)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stderr).ReadString('\n'); err != nil || !strings.Contains(line, "tracing") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("kpr trace --frontend %s: %q, %v", fe, line, err)
	}
	do()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("kpr trace --count 1: %v", err)
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("kpr trace --count 1 printed no decision within 10s: %q", stdout.String())
	}
	return stdout.String()
}

// setAnnotation sets (or, with value "", removes) an annotation of pod.
func setAnnotation(t *testing.T, f *fixture, pod *v1.Pod, key, value string) {
	t.Helper()
	cur, err := f.client.CoreV1().Pods(pod.Namespace).Get(f.ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if value == "" {
		delete(cur.Annotations, key)
	} else {
		cur.Annotations[key] = value
	}
	if _, err := f.client.CoreV1().Pods(pod.Namespace).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// podProcess gives the pod a process as a node would: a cgroup named
// after its UID under the kubelet's tree (kubepods/burstable/pod<uid>,
// with one container's cgroup below), below cgroupRoot, and in it a
// process of the pod's network namespace. The cleanup ends the process
// and removes the cgroups.
func podProcess(t *testing.T, cgroupRoot string, uid types.UID, ns *harness.NetNS) {
	t.Helper()
	pod := filepath.Join(cgroupRoot, "kubepods", "burstable", "pod"+string(uid))
	container := filepath.Join(pod, "cri-containerd-app")
	if err := os.MkdirAll(container, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	if err := harness.StartCommand(ns, cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, dir := range []string{container, pod, filepath.Dir(pod), filepath.Join(cgroupRoot, "kubepods")} {
			var err error
			for range 50 { // an exited process keeps its cgroup busy for a moment
				if err = unix.Rmdir(dir); !errors.Is(err, unix.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, unix.ENOENT) {
				t.Errorf("remove cgroup %s: %v", dir, err)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(container, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sidecarPort is Istio's outbound capture port.
const sidecarPort = 15001

// startSidecar installs the mesh's redirect of TCP to vip in ns, as
// Istio's init container does, and listens on the capture port as a
// stand-in for the mesh's proxy: it answers each connection redirected to
// it with the original destination it reads.
func startSidecar(t *testing.T, ns *harness.NetNS, vip netip.AddrPort) {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+ns.Path, "iptables", "-t", "nat", "-A", "OUTPUT", "-p", "tcp",
		"-d", vip.Addr().String(), "--dport", strconv.Itoa(int(vip.Port())), "-j", "REDIRECT", "--to-ports", strconv.Itoa(sidecarPort)).CombinedOutput()
	if err != nil {
		t.Fatalf("iptables REDIRECT in the mesh pod's namespace: %v: %s", err, out)
	}
	var ln net.Listener
	if err := harness.Do(ns, func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", sidecarPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dst, err := originalDst(c.(*net.TCPConn))
			if err != nil {
				fmt.Fprintf(c, "sidecar error: %v\n", err)
			} else {
				fmt.Fprintf(c, "sidecar saw %s\n", dst)
			}
			c.Close()
		}
	}()
}

// originalDst reads SO_ORIGINAL_DST: where the redirected connection was
// headed before netfilter's REDIRECT, as a struct sockaddr_in.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.RawSockaddrInet4
	var sockErr error
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(sa))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, soOriginalDst,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			sockErr = fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", errno)
		}
	})
	if err == nil {
		err = sockErr
	}
	if err != nil {
		return netip.AddrPort{}, err
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), nil
}

// soOriginalDst is SO_ORIGINAL_DST (linux/netfilter_ipv4.h).
const soOriginalDst = 80

// askThroughSidecar connects from ns to vip and returns the first line:
// the sidecar's report, or a backend's greeting.
func askThroughSidecar(ns *harness.NetNS, vip netip.AddrPort) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := harness.DialTCP(ns, vip, dialTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// A bypassed pod's packet path outlives kpr: killed as a crash would, and
// stopped as a rolling update does, kpr leaves the programs on the pod's
// veth and their conntrack pinned, so the pod's new connections and the
// ones it holds go on while no kpr runs. The new kpr finds the pod's veth
// already served, and changes reach the pod again.
func TestKprRestartKeepsABypassedPodsPacketPath(t *testing.T) {
	f, _, web, vip := perPodWeb(t, "vm-restart")
	vm := f.bypassedPod(t, "vm")
	waitServes(t, tcpWho, vm.NetNS, vip, "pod-a", "pod-b")

	held, err := harness.DialTCP(vm.NetNS, vip, dialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldReader := bufio.NewReader(held)
	echoes := func(when string) {
		t.Helper()
		_ = held.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := held.Write([]byte("ping\n")); err != nil {
			t.Fatalf("%s: the held connection: %v", when, err)
		}
		for {
			line, err := heldReader.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: the held connection echoes nothing: %v", when, err)
			}
			if line == "ping\n" {
				return
			}
		}
	}
	echoes("before the restarts")

	probes := startProbing(vm.NetNS, vip, tcpWho, 5*time.Millisecond, "pod-a", "pod-b")
	probesRun := func(what string) {
		t.Helper()
		n0, _ := probes.okSince()
		waitUntil(t, convergeTimeout, what, func() error {
			if n, _ := probes.okSince(); n < n0+5 {
				return errNotYet
			}
			return nil
		})
	}
	for _, stop := range []struct {
		how  string
		stop func() error
	}{{"killed", f.kpr.Kill}, {"stopped", f.kpr.Stop}} {
		probesRun("the bypassed pod's probes run before kpr is " + stop.how)
		if err := stop.stop(); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, convergeTimeout, "kpr exits", func() error {
			if !f.kpr.Exited() {
				return errNotYet
			}
			return nil
		})
		probesRun("the bypassed pod's probes run while no kpr runs, " + stop.how)
		echoes("no kpr running, " + stop.how)
		if err := f.kpr.Restart(); err != nil {
			t.Fatal(err)
		}
		f.waitHealthy()
		waitUntil(t, convergeTimeout, "the restarted kpr lists the packet path on the pod's veth", func() error {
			out, _ := f.kprStatus(t, "--metrics-address", f.kpr.MetricsAddr)
			if want := "packet path on " + vm.HostVeth; !strings.Contains(string(out), want) {
				return fmt.Errorf("kpr status lacks %q:\n%s", want, out)
			}
			return nil
		})
		probesRun("the bypassed pod's probes run after kpr was " + stop.how)
		echoes("after kpr was " + stop.how)
	}
	probes.finish(t)

	f.setEndpoints(t, web, v4, f.eps("pod-c")...)
	waitServes(t, tcpWho, vm.NetNS, vip, "pod-c")
	f.requireRunning(t)
}

// perPodWeb starts kpr with --socket-lb per-pod and a Service web in a new
// namespace named after name, served by pod-a and pod-b on TCP port 80.
func perPodWeb(t *testing.T, name string) (*fixture, string, *v1.Service, netip.AddrPort) {
	t.Helper()
	f := newFixture(t, "--socket-lb", "per-pod")
	ns := f.namespace(t, name)
	web := f.createService(t, kubeobj.Service(ns, "web", tcp80))
	f.setEndpoints(t, web, v4, f.eps("pod-a", "pod-b")...)
	vip := clusterIP(t, web, v1.IPv4Protocol, 80)
	waitServes(t, tcpWho, f.node.NetNS, vip, "pod-a", "pod-b")
	return f, ns, web, vip
}
