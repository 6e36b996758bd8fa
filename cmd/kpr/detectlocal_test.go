package main

import (
	"context"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/apiclient"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/cluster"
)

// --detect-local-mode and its two interface flags reach the netfilter
// modes' masquerade settings as kube-proxy reads them; a mode without
// what it needs, or an unknown one, is refused naming the flag to set.
func TestDetectLocalModeFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want netfilter.LocalTraffic
	}{
		{[]string{"--cluster-cidr=10.244.0.0/16"}, netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}},
		{[]string{"--detect-local-mode=ClusterCIDR", "--cluster-cidr=10.244.0.0/16"}, netfilter.LocalTraffic{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}},
		{[]string{"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cni0"}, netfilter.LocalTraffic{Bridge: "cni0"}},
		{[]string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=cali"}, netfilter.LocalTraffic{InterfacePrefix: "cali"}},
		// ClusterCIDR without a --cluster-cidr tells nothing apart.
		{[]string{"--detect-local-mode=ClusterCIDR"}, netfilter.LocalTraffic{}},
	} {
		f, _, ignored, err := parseRun(t, c.args...)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		masq, err := f.masquerade()
		if err != nil || !reflect.DeepEqual(masq.Local, c.want) {
			t.Errorf("%v: local traffic = %+v, %v; want %+v", c.args, masq.Local, err, c.want)
		}
		if !ignored.empty() {
			t.Errorf("%v: named as ignored: %+v", c.args, ignored)
		}
	}
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--detect-local-mode=BridgeInterface"}, "--pod-bridge-interface"},
		{[]string{"--detect-local-mode=InterfaceNamePrefix"}, "--pod-interface-name-prefix"},
		{[]string{"--detect-local-mode=Subnet"}, "ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix"},
	} {
		f, _, _, err := parseRun(t, c.args...)
		if err == nil {
			_, err = f.watcherConfig()
		}
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("%v: err %v, want one mentioning %q", c.args, err, c.mention)
		}
	}
	// NodeCIDR's ranges come from the Node at start (waitForNodePodCIDRs).
	f, _, _, err := parseRun(t, "--detect-local-mode=NodeCIDR")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.masquerade(); err == nil || !strings.Contains(err.Error(), "podCIDRs") {
		t.Errorf("NodeCIDR before the Node was read: err %v, want one about its podCIDRs", err)
	}
}

// The configuration file's detectLocalMode and detectLocal fields are the
// flags', as in kube-proxy.
func TestDetectLocalFromConfigFile(t *testing.T) {
	f, _, ignored, err := parseRun(t, "--config", "testdata/kubeadm-tuned.conf")
	if err != nil {
		t.Fatal(err)
	}
	masq, err := f.masquerade()
	if err != nil || masq.Local.InterfacePrefix != "veth" || masq.Local.Bridge != "" || len(masq.Local.CIDRs) != 0 {
		t.Errorf("local traffic from the file = %+v, %v; want the interface prefix veth", masq.Local, err)
	}
	for _, u := range ignored.unsupported {
		if strings.Contains(u, "detectLocal") {
			t.Errorf("%s named as unsupported", u)
		}
	}
}

// Under NodeCIDR kpr waits for the Node's spec.podCIDRs, as kube-proxy
// does, and takes them once the controller manager has allocated them.
func TestNodeCIDRWaitsForThePodCIDRs(t *testing.T) {
	c := cluster.StartForTest(t, cluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateNode(ctx, "node-a", []string{"192.0.2.10"}, nil); err != nil {
		t.Fatal(err)
	}
	client, err := apiclient.New(apiclient.Connection{Kubeconfig: c.KubeconfigPath})
	if err != nil {
		t.Fatal(err)
	}
	f := &runFlags{detectLocal: detectLocalFlags{mode: detectByNodeCIDR}}
	done := make(chan error, 1)
	go func() { done <- f.waitForNodePodCIDRs(ctx, client.Core, "node-a", zaptest.NewLogger(t)) }()
	select {
	case err := <-done:
		t.Fatalf("returned (%v) before the Node had podCIDRs", err)
	case <-time.After(time.Second):
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Spec.PodCIDR, node.Spec.PodCIDRs = "10.244.3.0/24", []string{"10.244.3.0/24", "fd00:244:3::/64"}
	if _, err := c.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	masq, err := f.masquerade()
	want := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:244:3::/64")}
	if err != nil || !reflect.DeepEqual(masq.Local.CIDRs, want) {
		t.Errorf("local traffic = %+v, %v; want the Node's podCIDRs %v", masq.Local, err, want)
	}
}

// --ipvs-exclude-cidrs is parsed, and a range that is not one is refused
// at start, naming the flag.
func TestIPVSExcludeCIDRsFlag(t *testing.T) {
	f, _, ignored, err := parseRun(t, "--ipvs-exclude-cidrs=10.96.100.0/24,fd00:96::/64")
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.ipvs.excluded()
	want := []netip.Prefix{netip.MustParsePrefix("10.96.100.0/24"), netip.MustParsePrefix("fd00:96::/64")}
	if err != nil || !reflect.DeepEqual(got, want) || !ignored.empty() {
		t.Errorf("--ipvs-exclude-cidrs = %v, %v (ignored %+v); want %v", got, err, ignored, want)
	}
	f, _, _, err = parseRun(t, "--ipvs-exclude-cidrs=10.96.100.0")
	if err == nil {
		_, err = f.watcherConfig()
	}
	if err == nil || !strings.Contains(err.Error(), "--ipvs-exclude-cidrs") {
		t.Errorf("a bad range: err %v, want one naming --ipvs-exclude-cidrs", err)
	}
}
