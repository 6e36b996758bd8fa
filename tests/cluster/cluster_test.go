package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestClusterServesDualStackServicesAndSurvivesAPIRestart runs the whole
// life of a cluster once (a start costs seconds): create and read back a
// dual-stack Service and an EndpointSlice, use the kubeconfig file as another
// process would, stop and restart the API server, and check that both the
// existing client and a new one from the kubeconfig get through again and
// that etcd kept the objects.
func TestClusterServesDualStackServicesAndSurvivesAPIRestart(t *testing.T) {
	began := time.Now()
	c := StartForTest(t, Options{})
	t.Logf("cluster started in %v", time.Since(began))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if v, err := c.Client.Discovery().ServerVersion(); err != nil || v.GitVersion != "v1.37.2" {
		t.Errorf("server version = %v (err %v), want v1.37.2 (stale tools build?)", v, err)
	}

	svc := createDualStackService(ctx, t, c.Client)
	createEndpointSlice(ctx, t, c.Client, svc)

	fileClient := clientFromKubeconfig(t, c.KubeconfigPath)
	if _, err := fileClient.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("reading the Service through the kubeconfig file: %v", err)
	}

	if err := c.CreateNode(ctx, "node-a", []string{"192.0.2.10", "2001:db8::10"}, map[string]string{"topology.kubernetes.io/zone": "z1"}); err != nil {
		t.Fatal(err)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading back node-a: %v", err)
	}
	if got := internalIPs(node); got != "192.0.2.10,2001:db8::10" {
		t.Errorf("node-a InternalIPs = %q, want 192.0.2.10,2001:db8::10", got)
	}
	if node.Labels["topology.kubernetes.io/zone"] != "z1" {
		t.Errorf("node-a labels = %v, want zone z1", node.Labels)
	}

	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	shortCtx, shortCancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = c.Client.CoreV1().Services("default").Get(shortCtx, svc.Name, metav1.GetOptions{})
	shortCancel()
	if err == nil {
		t.Fatal("API server answered after StopAPIServer; the outage did not happen")
	}

	began = time.Now()
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server restarted in %v", time.Since(began))

	got, err := c.Client.CoreV1().Services("default").Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("existing client after API server restart: %v", err)
	}
	if got.UID != svc.UID {
		t.Errorf("Service UID after restart = %s, want %s (etcd data lost?)", got.UID, svc.UID)
	}
	if _, err := clientFromKubeconfig(t, c.KubeconfigPath).DiscoveryV1().EndpointSlices("default").Get(ctx, "web-abc", metav1.GetOptions{}); err != nil {
		t.Fatalf("new client from the kubeconfig after API server restart: %v", err)
	}

	// Stop must leave no process behind; Cleanup's second Stop is a no-op.
	pids := controlPlanePIDs(c)
	if len(pids) != 2 {
		t.Fatalf("found control-plane processes %v, want etcd and kube-apiserver", pids)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if processAlive(pid) {
			t.Errorf("control-plane process %d still running after Stop", pid)
		}
	}
	if _, err := os.Stat(c.workDir); !os.IsNotExist(err) {
		t.Errorf("work dir %s still exists after Stop (err=%v)", c.workDir, err)
	}
}

// TestStartReportsMissingTools checks that an explicit tools directory
// without the binaries fails at once with the command that fixes it.
func TestStartReportsMissingTools(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(context.Background(), Options{ToolsDir: dir})
	if err == nil || !strings.Contains(err.Error(), "make tools") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("Start with empty ToolsDir: error %v, want one naming %s and `make tools`", err, dir)
	}
}

func createDualStackService(ctx context.Context, t *testing.T, client kubernetes.Interface) *corev1.Service {
	t.Helper()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &policy,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports:          []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a dual-stack Service: %v", err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("Service ClusterIPs = %v, want one IPv4 and one IPv6", svc.Spec.ClusterIPs)
	}
	for i, cidr := range []string{"10.96.0.0/16", "fd00:96::/112"} {
		_, ipnet, _ := net.ParseCIDR(cidr)
		if ip := net.ParseIP(svc.Spec.ClusterIPs[i]); ip == nil || !ipnet.Contains(ip) {
			t.Errorf("ClusterIPs[%d] = %s, want an address in %s", i, svc.Spec.ClusterIPs[i], cidr)
		}
	}
	return svc
}

func createEndpointSlice(ctx context.Context, t *testing.T, client kubernetes.Interface, svc *corev1.Service) {
	t.Helper()
	ready := true
	port := int32(8080)
	name := "http"
	proto := corev1.ProtocolTCP
	_, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "web-abc",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"10.244.1.5"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating an EndpointSlice: %v", err)
	}
	slices, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + svc.Name,
	})
	if err != nil {
		t.Fatalf("listing EndpointSlices of %s: %v", svc.Name, err)
	}
	if len(slices.Items) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != "10.244.1.5" || *slices.Items[0].Ports[0].Port != 8080 {
		t.Fatalf("EndpointSlices of %s = %+v, want the one just created", svc.Name, slices.Items)
	}
}

func clientFromKubeconfig(t *testing.T, path string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("loading kubeconfig %s: %v", path, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset from kubeconfig %s: %v", path, err)
	}
	return client
}

func internalIPs(node *corev1.Node) string {
	var ips []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			ips = append(ips, a.Address)
		}
	}
	return strings.Join(ips, ",")
}

// controlPlanePIDs finds the running etcd and kube-apiserver processes whose
// command line mentions this cluster's work directory (their data and
// certificate directories live there), so only our own are looked at.
func controlPlanePIDs(c *Cluster) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		comm, err := os.ReadFile(p + "/comm")
		if name := strings.TrimSpace(string(comm)); err != nil || (name != etcdBinary && name != apiServerBinary) {
			continue
		}
		cmdline, err := os.ReadFile(p + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), c.workDir) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(p, "/proc/%d", &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func processAlive(pid int) bool {
	// A zombie has an empty cmdline; it is gone as far as we care.
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && len(data) > 0
}

// TestStartRetriesLostPortRace makes kube-apiserver fail as if its port had
// been taken, on every attempt but the last, and checks that Start retries
// each time with a new API server port and then succeeds.
func TestStartRetriesLostPortRace(t *testing.T) {
	real, err := resolveToolsDir("", os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(real, etcdBinary), filepath.Join(dir, etcdBinary)); err != nil {
		t.Fatal(err)
	}
	// Each start appends its --secure-port flag to a file; all but the
	// last exit as a server whose port was taken does.
	script := fmt.Sprintf(`#!/bin/sh
for arg; do case "$arg" in --secure-port=*) echo "$arg" >> %[2]s;; esac; done
if [ "$(wc -l < %[2]s)" -lt %[3]d ]; then
	echo "listen tcp 127.0.0.1:1: bind: address already in use" >&2
	exit 1
fi
exec %[1]s "$@"
`, shellQuote(filepath.Join(real, apiServerBinary)), shellQuote(filepath.Join(dir, "starts")), maxStartAttempts)
	if err := os.WriteFile(filepath.Join(dir, apiServerBinary), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	c := StartForTest(t, Options{ToolsDir: dir})
	if _, err := c.Client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("cluster after a retried start: %v", err)
	}
	starts, _ := os.ReadFile(filepath.Join(dir, "starts"))
	ports := strings.Fields(string(starts))
	if len(ports) != maxStartAttempts {
		t.Fatalf("kube-apiserver was started with %v, want %d starts: the failures, then a success", ports, maxStartAttempts)
	}
	// Ports are drawn anew, so two attempts may by chance get the same
	// one; that all did means they were not drawn anew.
	if slices.Equal(slices.Compact(slices.Clone(ports)), ports[:1]) {
		t.Errorf("every attempt used %s; a retry must pick new ports", ports[0])
	}
}
