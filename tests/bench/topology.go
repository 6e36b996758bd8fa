package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kpr-io/kpr/tests/cluster"
	"github.com/kpr-io/kpr/tests/harness"
)

// Addresses of the benchmark topology (see doc.go for the picture).
var (
	// apiAddr is the API server's address inside the infra namespace,
	// on its stand-in NIC, and its --advertise-address.
	apiAddr = netip.MustParsePrefix("172.31.0.1/32")
	// nodeIP is every node namespace's address, on its stand-in NIC, and
	// the InternalIP of the Node object the proxies read.
	nodeIP = netip.MustParsePrefix("192.168.100.10/24")
	// nodePodGateway is the node bridge's address; pods get the
	// addresses after it, in creation order.
	nodePodGateway  = netip.MustParsePrefix("10.244.0.1/24")
	nodePodGateway6 = netip.MustParsePrefix("fd00:244::1/64")
	// The infra namespace's own pod bridge is unused; it gets a subnet
	// of its own so that nothing there looks like a node's pods.
	infraBridgeV4 = netip.MustParsePrefix("10.254.0.1/24")
	infraBridgeV6 = netip.MustParsePrefix("fd00:254::1/64")
)

// nodeName is the Node object every proxy reads as its own.
const nodeName = "bench-node"

// Backend pods of every node: 10 "main" pods that every Service's slice
// lists, and 10 "alt" pods the probe Service's slice is switched to and
// back (see workload.go). They answer on targetPort with their name.
const (
	backendsPerGroup = 10
	mainPrefix       = "be-"
	altPrefix        = "alt-"
)

// Infra is the control plane: etcd and kube-apiserver in a namespace of
// their own, which every node namespace reaches through a veth of its own.
// The API server and the Services stay up across proxies and Service
// counts; only the node namespace is made fresh for each proxy run.
type Infra struct {
	Cluster *cluster.Cluster
	// NodeKubeconfig reaches the API server at apiAddr from inside a node
	// namespace (the cluster's own kubeconfig uses a host loopback relay).
	NodeKubeconfig string

	ns    *harness.Node // holds the API server; its pods are unused
	links int           // node links made so far, numbering their subnets
}

// StartInfra creates the infra namespace and starts the cluster in it,
// both torn down by t's cleanup.
func StartInfra(t testing.TB) (*Infra, error) {
	ns, err := harness.NewNode(t, harness.Options{GatewayV4: infraBridgeV4, GatewayV6: infraBridgeV6})
	if err != nil {
		return nil, fmt.Errorf("create the infra namespace: %w", err)
	}
	if err := ns.AddAddress(apiAddr); err != nil {
		return nil, fmt.Errorf("add the API server address to the infra namespace: %w", err)
	}
	c := cluster.StartForTest(t, cluster.Options{NetNS: ns.NetNS.Name, AdvertiseAddress: apiAddr.Addr().String()})
	in := &Infra{Cluster: c, ns: ns}
	if in.NodeKubeconfig, err = nodeKubeconfig(c.KubeconfigPath, t.TempDir()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.CreateNode(ctx, nodeName, []string{nodeIP.Addr().String()}, nil); err != nil {
		return nil, err
	}
	return in, nil
}

// nodeKubeconfig writes a copy of the cluster's kubeconfig that points at
// apiAddr on the same port. The serving certificate names only localhost
// and 127.0.0.1, so it sets tls-server-name.
func nodeKubeconfig(adminPath, dir string) (string, error) {
	cfg, err := clientcmd.LoadFromFile(adminPath)
	if err != nil {
		return "", fmt.Errorf("read the cluster kubeconfig %s: %w", adminPath, err)
	}
	for name, c := range cfg.Clusters {
		u, err := url.Parse(c.Server)
		if err != nil {
			return "", fmt.Errorf("kubeconfig cluster %s: server %q: %w", name, c.Server, err)
		}
		u.Host = net.JoinHostPort(apiAddr.Addr().String(), u.Port())
		c.Server = u.String()
		c.TLSServerName = "localhost"
	}
	path := filepath.Join(dir, "node-kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write the node kubeconfig: %w", err)
	}
	return path, nil
}

// apiEndpoint is the API server's address as node namespaces reach it.
func (in *Infra) apiEndpoint() (netip.AddrPort, error) {
	u, err := url.Parse(in.Cluster.Config.Host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("parse the API server URL %q: %w", in.Cluster.Config.Host, err)
	}
	var port uint16
	if _, err := fmt.Sscan(u.Port(), &port); err != nil {
		return netip.AddrPort{}, fmt.Errorf("API server URL %q has no port: %w", in.Cluster.Config.Host, err)
	}
	return netip.AddrPortFrom(apiAddr.Addr(), port), nil
}

// NodeEnv is one fresh node namespace with its backend pods and its link
// to the infra namespace. It is torn down by the cleanup of the test that
// made it.
type NodeEnv struct {
	Node *harness.Node
	// Main and Alt are the backend pods, in the order of expectedBackends.
	Main, Alt []*harness.Pod
}

// expectedBackends returns the pod addresses every node's backends get:
// the harness hands out pod addresses in creation order from the gateway
// up, so each fresh node has the same ones and the EndpointSlices written
// once stay valid for every proxy run.
func expectedBackends(prefix string) []netip.Addr {
	first := 0
	if prefix == altPrefix {
		first = backendsPerGroup
	}
	addrs := make([]netip.Addr, backendsPerGroup)
	a := nodePodGateway.Addr()
	for range first + 1 {
		a = a.Next()
	}
	for i := range addrs {
		addrs[i] = a
		a = a.Next()
	}
	return addrs
}

// NewNode makes a fresh node namespace for one proxy run: backend pods
// with echo servers, the node address, and a veth to the infra namespace
// carrying the node's default route, so the API server (and nothing else)
// is reachable. Unprogrammed ClusterIPs follow the default route into the
// infra namespace, which has no route for them and answers "unreachable":
// a client learns at once that a Service is not served.
func (in *Infra) NewNode(t testing.TB) (*NodeEnv, error) {
	node, err := harness.NewNode(t, harness.Options{GatewayV4: nodePodGateway, GatewayV6: nodePodGateway6})
	if err != nil {
		return nil, err
	}
	env := &NodeEnv{Node: node}
	if err := node.AddAddress(nodeIP); err != nil {
		return nil, err
	}
	for _, g := range []struct {
		prefix string
		pods   *[]*harness.Pod
	}{{mainPrefix, &env.Main}, {altPrefix, &env.Alt}} {
		want := expectedBackends(g.prefix)
		for i := range backendsPerGroup {
			pod, err := node.AddPod(fmt.Sprintf("%s%d", g.prefix, i))
			if err != nil {
				return nil, err
			}
			if pod.IPv4 != want[i] {
				return nil, fmt.Errorf("pod %s got %s, but the EndpointSlices name %s (the harness no longer hands out pod addresses in order?)", pod.Name, pod.IPv4, want[i])
			}
			if _, err := pod.ServeTCP(targetPort); err != nil {
				return nil, err
			}
			*g.pods = append(*g.pods, pod)
		}
	}
	if err := in.link(node); err != nil {
		return nil, fmt.Errorf("link node %s to the infra namespace: %w", node.NetNS.Name, err)
	}
	return env, nil
}

// link connects node to the infra namespace: veth "infra0" in the node
// (172.30.K.2/24, default route via .1) and "nodeK" in infra (172.30.K.1/24).
// The node namespace is deleted with its end of the veth, which removes
// both ends.
func (in *Infra) link(node *harness.Node) error {
	in.links++
	k := in.links
	if k > 250 {
		return errors.New("more than 250 node links made; the 172.30.K.0/24 numbering ran out")
	}
	infraSide := netip.MustParsePrefix(fmt.Sprintf("172.30.%d.1/24", k))
	nodeSide := netip.MustParsePrefix(fmt.Sprintf("172.30.%d.2/24", k))
	infraNL, nodeNL := in.ns.NetNS.Netlink(), node.NetNS.Netlink()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: fmt.Sprintf("node%d", k)},
		PeerName:      "infra0",
		PeerNamespace: netlink.NsFd(int(node.NetNS.Handle())),
	}
	if err := infraNL.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s<->infra0: %w", veth.Name, err)
	}
	nodeEnd, err := nodeNL.LinkByName("infra0")
	if err != nil {
		return err
	}
	for _, side := range []struct {
		nl   *netlink.Handle
		link netlink.Link
		addr netip.Prefix
	}{{infraNL, veth, infraSide}, {nodeNL, nodeEnd, nodeSide}} {
		if err := side.nl.AddrAdd(side.link, &netlink.Addr{IPNet: prefixNet(side.addr)}); err != nil {
			return fmt.Errorf("add %s to %s: %w", side.addr, side.link.Attrs().Name, err)
		}
		if err := side.nl.LinkSetUp(side.link); err != nil {
			return fmt.Errorf("set %s up: %w", side.link.Attrs().Name, err)
		}
	}
	if err := nodeNL.RouteAdd(&netlink.Route{LinkIndex: nodeEnd.Attrs().Index, Gw: infraSide.Addr().AsSlice()}); err != nil {
		return fmt.Errorf("add the node's default route via %s: %w", infraSide.Addr(), err)
	}
	// Until both ends are operationally up the veth drops what it is
	// given, and a lost first SYN to the API server would add a 1s
	// retransmit to the proxy's cold start.
	for _, side := range []struct {
		nl    *netlink.Handle
		index int
	}{{infraNL, veth.Attrs().Index}, {nodeNL, nodeEnd.Attrs().Index}} {
		if err := waitOperUp(side.nl, side.index); err != nil {
			return err
		}
	}
	return nil
}

func waitOperUp(nl *netlink.Handle, index int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := nl.LinkByIndex(index)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s not operationally up after 10s (state %s)", l.Attrs().Name, l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// checkAPIReachable opens (and closes) a TCP connection from the node
// namespace to the API server: the path works, and its neighbour entries
// are warm before the proxy's clock starts.
func (in *Infra) checkAPIReachable(env *NodeEnv) error {
	api, err := in.apiEndpoint()
	if err != nil {
		return err
	}
	c, err := harness.DialTCP(env.Node.NetNS, api, 5*time.Second)
	if err != nil {
		return fmt.Errorf("the API server is not reachable from node %s: %w", env.Node.NetNS.Name, err)
	}
	return c.Close()
}
