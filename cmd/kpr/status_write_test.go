package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/socketlb"
	"github.com/kpr-io/kpr/watcher"
)

// The status screen names where each link runs and, for stuck watches,
// says so on a line of its own.
func TestWriteStatusShowsAttachmentsAndStuckWatches(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	heard := now.Add(-4 * time.Minute)
	st := statusOutput{
		Daemon: &daemonStatus{Version: "v1", Mode: "ebpf", Reason: "r", StartedAt: now.Add(-time.Hour),
			Watcher: watcher.Status{API: watcher.APIStatus{Connected: true, LastHeard: &heard, Stuck: true}}},
		BPFRoot: "/sys/fs/bpf/kpr",
		Attached: []dataplane.Inspection{ebpfplane.LinkInspection("/sys/fs/bpf/kpr", []loader.LinkStatus{
			{Pin: "/sys/fs/bpf/kpr/links/kpr_connect4", Type: "CGroupInet4Connect", Program: "kpr_connect4", CgroupID: 7, Cgroup: "/sys/fs/cgroup/kubepods"},
			{Pin: "/sys/fs/bpf/kpr/links/tc-ingress-eth0", Type: "TCXIngress", Program: "kpr_tc_ingress", Ifindex: 2, Device: "eth0"},
			{Pin: "/sys/fs/bpf/kpr/links/tc-egress-eth1", Type: "TCXEgress", Program: "kpr_tc_egress", Ifindex: 3},
			{Pin: "/sys/fs/bpf/kpr/links/kpr_sendmsg4", Error: "no such file"},
		})},
	}
	var b bytes.Buffer
	writeStatus(&b, st, now)
	out := b.String()
	for _, want := range []string{
		"api:      connected, last heard from 2026-12-01T11:56:00Z (4m0s ago)",
		"WATCHES STUCK",
		"\nlinks under /sys/fs/bpf/kpr:\n  kpr_connect4     CGroupInet4Connect  program kpr_connect4    cgroup /sys/fs/cgroup/kubepods (id 7)\n",
		"  tc-ingress-eth0  TCXIngress          program kpr_tc_ingress  device eth0 (ifindex 2)\n",
		"ifindex 3 (not in this network namespace: give --host-netns)",
		"  kpr_sendmsg4     error: no such file\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	st.Daemon.Watcher.API.Stuck = false
	b.Reset()
	writeStatus(&b, st, now)
	if strings.Contains(b.String(), "STUCK") {
		t.Errorf("status says STUCK for watches that are not:\n%s", b.String())
	}
	if strings.Contains(b.String(), "NO TC PROGRAMS") {
		t.Errorf("status warns of headerless devices the daemon did not report:\n%s", b.String())
	}
}

// Devices the tc programs leave out for want of an Ethernet header are
// named on a line of their own.
func TestWriteStatusNamesHeaderlessDevices(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := statusOutput{Daemon: &daemonStatus{Version: "v1", Mode: "ebpf", StartedAt: now, HeaderlessDevices: []string{"tun0", "wg0"}}}
	var b bytes.Buffer
	writeStatus(&b, st, now)
	if want := "devices:  NO TC PROGRAMS on tun0, wg0: no Ethernet header"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}

// Under --socket-lb per-pod, kpr status names each bypassed pod and why,
// and a pod still waiting for its namespace says so.
func TestWriteStatusNamesBypassedPods(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	st := statusOutput{Daemon: &daemonStatus{Version: "v1", Mode: "ebpf", StartedAt: now, SocketLB: &socketLBStatus{Mode: "per-pod",
		Pods: []socketlb.PodStatus{
			{Pod: "shop/cart-1", Bypass: true, Reason: "mesh", Why: "Istio sidecar injected"},
			{Pod: "vm/win-0", Bypass: true, Reason: "sandbox", Why: "KubeVirt VM", Waiting: "no cgroup yet"},
		}}}}
	var b bytes.Buffer
	writeStatus(&b, st, now)
	for _, want := range []string{"sockets:  --socket-lb per-pod, bypassed pods: 2", "shop/cart-1 (mesh: Istio sidecar injected)",
		"vm/win-0 (sandbox: KubeVirt VM; NOT YET BYPASSED: no cgroup yet)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}
