package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/socketlb"
)

// podPath is `kpr explain --pod`: which path serves a pod's traffic to
// Services, why, and whether the node's dataplane agrees.
type podPath struct {
	Pod string `json:"pod"`
	// Path is "socket hooks" or "packet path".
	Path string `json:"path"`
	Why  string `json:"why"`
	// Devices are the node's ends of the pod's veths, where the packet
	// path's programs go; NetNSCookie is the pod's network namespace.
	// Both are empty when explain could not find the pod's network.
	Devices     []string `json:"devices,omitempty"`
	NetNSCookie uint64   `json:"netnsCookie,omitempty"`
	// Dataplane says what the node holds for the pod, or why explain
	// could not tell.
	Dataplane   string   `json:"dataplane"`
	Divergences []string `json:"divergences,omitempty"`
}

const (
	pathSocketHooks = "socket hooks"
	pathPacket      = "packet path"
)

// explainPod decides for the pod ("namespace/name") as `kpr run` with the
// same --socket-lb does, and compares with the node.
func explainPod(ctx context.Context, client *apiclient.Clients, at dataplaneAt, arg string) (*podPath, error) {
	ns, name, ok := strings.Cut(arg, "/")
	if !ok || ns == "" || name == "" {
		return nil, fmt.Errorf("--pod %q: want namespace/name", arg)
	}
	var pod v1.Pod
	if err := client.Core.Get().Namespace(ns).Resource("pods").Name(name).Do(ctx).Into(&pod); err != nil {
		return nil, fmt.Errorf("get Pod %s: %w", arg, err)
	}
	mode, err := loader.ParseSocketLBMode(at.run.ebpf.socketLB)
	if err != nil {
		return nil, err
	}
	out := &podPath{Pod: arg}
	d := socketlb.Decision{Why: "--socket-lb all: the socket hooks serve every pod"}
	if mode != loader.SocketLBAll {
		handler := ""
		if rc := socketlb.RuntimeClassName(&pod); rc != "" {
			var class nodev1.RuntimeClass
			if err := client.Node.Get().Resource("runtimeclasses").Name(rc).Do(ctx).Into(&class); err != nil {
				return nil, fmt.Errorf("get RuntimeClass %s of Pod %s: %w", rc, arg, err)
			}
			handler = class.Handler
		}
		rules := socketlb.Rules{SandboxHandlers: at.run.ebpf.sandboxHandlers, HostOnly: mode == loader.SocketLBHostOnly}
		d = rules.Decide(&pod, handler)
	}
	out.Path, out.Why = pathSocketHooks, d.Why
	if d.Bypass {
		out.Path = pathPacket
	}
	if pod.Spec.NodeName != at.nodeName {
		out.Dataplane = fmt.Sprintf("not compared: the pod runs on node %s, not on %s (run explain there, or pass that node's --hostname-override)",
			pod.Spec.NodeName, at.nodeName)
		return out, nil
	}
	out.compare(at, pod, mode, d.Bypass)
	return out, nil
}

// compare reads what the node holds for the pod: its namespace in
// kpr_sock_bypass, and the pods' programs on its devices.
func (p *podPath) compare(at dataplaneAt, pod v1.Pod, mode loader.SocketLBMode, bypass bool) {
	root := at.run.ebpf.cgroupRoot
	if root == "" {
		var err error
		if root, err = loader.FindCgroup2Mount(); err != nil {
			p.Dataplane = "not compared: " + err.Error()
			return
		}
	}
	finder := socketlb.PodNamespaces{CgroupRoot: root, NetNSCookie: loader.NetNSCookie, NodeNetNS: at.run.hostNetNS}
	found, err := finder.Find(pod.UID)
	if err != nil {
		p.Dataplane = "not compared: " + err.Error()
		return
	}
	p.Devices, p.NetNSCookie = found.Devices, found.Cookie
	onPath, err := loader.PodTCAttachedDevices(at.bpfRoot, at.run.hostNetNS)
	if err != nil {
		p.Dataplane = "not compared: " + err.Error()
		return
	}
	attached := slices.ContainsFunc(found.Devices, func(d string) bool { return slices.Contains(onPath, d) })
	if bypass && !attached {
		p.Divergences = append(p.Divergences, fmt.Sprintf("the packet path's programs are not on the pod's devices %s", strings.Join(found.Devices, ",")))
	}
	if !bypass && attached {
		p.Divergences = append(p.Divergences, fmt.Sprintf("the packet path's programs are still on the pod's devices %s", strings.Join(found.Devices, ",")))
	}
	listed := "not listed"
	if mode == loader.SocketLBPerPod {
		pinned, err := openPinnedMaps("explain", at.bpfRoot)
		if err != nil {
			p.Dataplane = "not compared: " + err.Error()
			return
		}
		defer pinned.Close()
		inMap, err := maps.NewSockBypass(pinned.KprSockBypass).List()
		if err != nil {
			p.Dataplane = "not compared: " + err.Error()
			return
		}
		_, isListed := inMap[found.Cookie]
		if isListed {
			listed = "listed"
		}
		if bypass != isListed {
			want := map[bool]string{true: "listed", false: "not listed"}[bypass]
			p.Divergences = append(p.Divergences, fmt.Sprintf("the pod's network namespace (cookie %d) is %s in kpr_sock_bypass, want %s", found.Cookie, listed, want))
		}
	}
	where := "programs on none of its devices"
	if attached {
		where = "programs on " + strings.Join(found.Devices, ",")
	}
	p.Dataplane = fmt.Sprintf("network namespace cookie %d %s in kpr_sock_bypass; packet path %s", found.Cookie, listed, where)
}

func writePodPath(w io.Writer, p *podPath) {
	fmt.Fprintf(w, "Pod %s reaches Services through the %s: %s\n", p.Pod, p.Path, p.Why)
	fmt.Fprintf(w, "  dataplane: %s\n", p.Dataplane)
	for _, d := range p.Divergences {
		fmt.Fprintf(w, "  DIVERGENCE: %s\n", d)
	}
}
