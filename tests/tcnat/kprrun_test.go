package tcnat

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// testCluster starts a real API server for a test of `kpr run` and
// registers nodeName's Node object, with the node namespace's address.
func testCluster(ctx context.Context, t *testing.T, nodeName string) (*cluster.Cluster, kubeobj.Client) {
	t.Helper()
	harness.RequireRoot(t)
	cl := cluster.StartForTest(t, cluster.Options{APIServerArgs: map[string]string{"request-timeout": "5s"}})
	if err := cl.CreateNode(ctx, nodeName, []string{nodeAddrs[0].Addr().String()},
		map[string]string{v1.LabelHostname: nodeName}); err != nil {
		t.Fatal(err)
	}
	return cl, kubeobj.Client{Interface: cl.Client}
}

// runKpr starts `kpr run` as nodeName, serving the node namespace
// hostNetNS with args, and waits for its first sync. Its socket hooks go to
// a cgroup of the test's that holds no process: only the tc programs
// matter here. The cleanup stops it and removes its dataplane, and shows
// its log when the test failed.
func runKpr(ctx context.Context, t *testing.T, cl *cluster.Cluster, nodeName, hostNetNS string, args ...string) *kprproc.Process {
	t.Helper()
	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	kpr, err := kprproc.Start(kprproc.Options{
		Kubeconfig: cl.KubeconfigPath, NodeName: nodeName, CgroupRoot: cg.Path, HostNetNS: hostNetNS,
		Args: args, LogPath: filepath.Join(t.TempDir(), "kpr.log"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kpr log:\n%s", kpr.Log())
		}
		if err := kpr.Cleanup(); err != nil {
			t.Errorf("kpr cleanup: %v", err)
		}
	})
	if err := kpr.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	return kpr
}

// createNodePort creates namespace ns and in it a NodePort Service "np" on
// port 80, whose endpoints are the pods' echo servers (IPv4) on nodeName,
// and returns its NodePort on the node's address.
func createNodePort(ctx context.Context, t *testing.T, api kubeobj.Client, ns, nodeName string, pods ...*harness.Pod) netip.AddrPort {
	t.Helper()
	if _, err := api.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	np := kubeobj.Service(ns, "np", kubeobj.Port{Name: "tcp", Port: 80, TargetPort: echoPort})
	np.Spec.Type = v1.ServiceTypeNodePort
	np, err := api.CreateService(ctx, np)
	if err != nil {
		t.Fatal(err)
	}
	var eps []kubeobj.Endpoint
	for _, p := range pods {
		eps = append(eps, kubeobj.Endpoint{Addr: p.IPv4, NodeName: nodeName})
	}
	if err := api.ApplySlice(ctx, kubeobj.Slice(np, "np-ipv4", discoveryv1.AddressTypeIPv4, eps...)); err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(nodeAddrs[0].Addr(), uint16(np.Spec.Ports[0].NodePort))
}
