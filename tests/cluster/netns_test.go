package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kpr-io/kpr/tests/namedns"
)

// TestClusterInNetNS runs the control plane inside a network namespace made
// for the test and checks that: both servers really run in it, the host-side
// client (through the loopback relay) works, the "kubernetes" Service
// advertises Options.AdvertiseAddress, and a client inside the namespace
// reaches the API server on that address, also after an API server restart.
func TestClusterInNetNS(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace (and does not run under -short)")
	}
	const advertise = "192.0.2.1"
	nsName := makeTestNetNS(t, advertise+"/24")

	c := StartForTest(t, Options{NetNS: nsName, AdvertiseAddress: advertise})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	pids := controlPlanePIDs(c)
	if len(pids) != 2 {
		t.Fatalf("found control-plane processes %v, want etcd and kube-apiserver", pids)
	}
	want, err := netnsInode(netnsPath(nsName))
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		got, err := netnsInode(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("process %d runs in netns inode %d, want %s's %d", pid, got, nsName, want)
		}
	}

	// The API server's endpoint reconciler writes this slice a moment
	// after /readyz turns green, so wait for it rather than read once.
	var slice *discoveryv1.EndpointSlice
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		s, err := c.Client.DiscoveryV1().EndpointSlices("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		slice = s
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("reading the kubernetes EndpointSlice from the host: %v", err)
	}
	if len(slice.Endpoints) != 1 || slice.Endpoints[0].Addresses[0] != advertise {
		t.Errorf("kubernetes EndpointSlice endpoints = %+v, want %s", slice.Endpoints, advertise)
	}

	// From inside the namespace: with the Config as is (127.0.0.1, as in
	// the kubeconfig), and on the advertised address, for which the
	// serving certificate (made for localhost) needs ServerName.
	ns, err := netns.GetFromPath(netnsPath(nsName))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	onAdvertised := rest.CopyConfig(c.Config)
	onAdvertised.Host = "https://" + net.JoinHostPort(advertise, c.apiPort)
	onAdvertised.TLSClientConfig.ServerName = "localhost"
	for _, cfg := range []*rest.Config{rest.CopyConfig(c.Config), onAdvertised} {
		cfg.Dial = func(_ context.Context, _, address string) (net.Conn, error) {
			return DialInNetNS(ns, address)
		}
		insideClient, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := insideClient.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Fatalf("reaching the API server at %s from inside %s: %v", cfg.Host, nsName, err)
		}
	}

	// An outage through the relay: the wrapper and relay outlive the API
	// server, so a restart is reachable from the host again.
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("host client after API server restart in %s: %v", nsName, err)
	}
}

// makeTestNetNS creates a network namespace holding the address cidr,
// deleted when the test ends. Its lo stays down: Start must bring it up.
func makeTestNetNS(t *testing.T, cidr string) string {
	t.Helper()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	name := "kpr-tc-" + hex.EncodeToString(suffix)
	h, err := namedns.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	t.Cleanup(func() {
		if err := namedns.Delete(name); err != nil {
			t.Errorf("deleting netns %s: %v", name, err)
		}
	})
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatalf("netlink handle in netns %s: %v", name, err)
	}
	defer nl.Close()
	// On lo, not a dummy or veth device: the kernel may lack those
	// modules, and the address only has to exist inside the namespace.
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatalf("finding lo in netns %s: %v", name, err)
	}
	if err := nl.AddrAdd(lo, addr); err != nil {
		t.Fatalf("adding %s to lo in netns %s: %v", cidr, name, err)
	}
	return name
}

func netnsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}
