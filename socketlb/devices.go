package socketlb

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// ErrNoNodeDevice is returned for a pod none of whose interfaces has its
// other end in the node's namespace: a CNI that gives pods ipvlan or
// macvlan interfaces, or a sandbox still being wired. The packet path
// has nowhere to sit for such a pod, so the socket hooks keep serving it.
var ErrNoNodeDevice = errors.New("none of the pod's interfaces is a veth whose other end is in the node's network namespace")

// nodeDevices names the node's ends of the veths of the network
// namespace at podNS: where the pod's packets enter the node, on a bridge
// CNI (the bridge's ports) as on a routed one. nodeNS is the node's
// namespace ("" for kpr's own).
//
// A veth's other end is named from inside the pod by its ifindex only, and
// an ifindex is unique per namespace: the node's link with that index is
// the pod's peer only if its own peer namespace is the pod's, which the
// node's id for the pod's namespace settles.
func nodeDevices(podNS, nodeNS string) ([]string, error) {
	pod, err := netns.GetFromPath(podNS)
	if err != nil {
		return nil, fmt.Errorf("open the pod's network namespace %s: %w", podNS, err)
	}
	defer pod.Close()
	inPod, err := netlink.NewHandleAt(pod)
	if err != nil {
		return nil, fmt.Errorf("netlink in the pod's network namespace %s: %w", podNS, err)
	}
	defer inPod.Close()
	node := netns.None()
	if nodeNS != "" {
		if node, err = netns.GetFromPath(nodeNS); err != nil {
			return nil, fmt.Errorf("open the node's network namespace %s: %w", nodeNS, err)
		}
		defer node.Close()
	}
	inNode, err := netlink.NewHandleAt(node)
	if err != nil {
		return nil, fmt.Errorf("netlink in the node's network namespace: %w", err)
	}
	defer inNode.Close()
	links, err := inPod.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list the pod's interfaces: %w", err)
	}
	var peers []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if l.Type() != "veth" || a.ParentIndex == 0 {
			continue
		}
		peer, err := inNode.LinkByIndex(a.ParentIndex)
		if err != nil || peer.Type() != "veth" || peer.Attrs().ParentIndex != a.Index {
			continue // its other end is in a third namespace
		}
		peers = append(peers, peer)
	}
	// The node's id of the pod's namespace, which its links carry for a
	// peer there; reading a link with a peer there (above) has the
	// kernel assign one.
	podID := -1
	if len(peers) > 0 {
		if podID, err = inNode.GetNetNsIdByFd(int(pod)); err != nil {
			return nil, fmt.Errorf("the node's id of the pod's network namespace: %w", err)
		}
	}
	var devices []string
	for _, peer := range peers {
		if podID >= 0 && peer.Attrs().NetNsID == podID && !slices.Contains(devices, peer.Attrs().Name) {
			devices = append(devices, peer.Attrs().Name)
		}
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("%w (namespace %s)", ErrNoNodeDevice, podNS)
	}
	slices.Sort(devices)
	return devices, nil
}
