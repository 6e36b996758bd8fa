package cluster

import (
	"context"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CreateNode creates the Node object kpr looks up for its own node (no
// kubelet runs here to do it): the given labels, and addrs as InternalIP
// addresses in status. Status is a subresource the create call ignores, so
// it is written by a second, UpdateStatus call.
func (c *Cluster) CreateNode(ctx context.Context, name string, addrs []string, labels map[string]string) error {
	status := corev1.NodeStatus{}
	for _, a := range addrs {
		if net.ParseIP(a) == nil {
			return fmt.Errorf("node %s: address %q is not an IP address", name, a)
		}
		status.Addresses = append(status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	node, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	node.Status = status
	if _, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting addresses of node %s: %w", name, err)
	}
	return nil
}
