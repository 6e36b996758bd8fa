package realcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// kubeadmConfig is the ClusterConfiguration kubeadm's add-on phases read:
// the cluster's release, Service range, pod range and DNS domain.
func kubeadmConfig() string {
	return fmt.Sprintf(`apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: %s
networking:
  serviceSubnet: %s
  podSubnet: %s
  dnsDomain: %s
`, KubernetesVersion, serviceCIDR, podCIDR, clusterDomain)
}

// kubeProxyConfig adds to kubeadmConfig what the kube-proxy add-on needs:
// the API server's address for kube-proxy's kubeconfig, and its mode.
func (c *Cluster) kubeProxyConfig(mode string) string {
	return strings.Replace(kubeadmConfig(), "networking:",
		fmt.Sprintf("controlPlaneEndpoint: %s:%s\nnetworking:", controlPlane, c.APIServerPort()), 1) +
		fmt.Sprintf("---\napiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: %s\n", mode)
}

// KubernetesVersion is the release of every Kubernetes binary of the
// cluster (hack/cluster-tools.sh, hack/tools.sh).
const KubernetesVersion = "v1.37.2"

// InstallCoreDNS installs CoreDNS as kubeadm does (kubeadm init phase addon
// coredns: its Deployment, the kube-dns Service on the tenth address of the
// Service range, RBAC and Corefile). Its pods become ready once a Service
// proxy lets them reach the API server through the kubernetes Service:
// WaitRollout(ctx, "kube-system", "deployment/coredns", ...) waits for that.
func (c *Cluster) InstallCoreDNS(ctx context.Context) error {
	return c.kubeadmAddon(ctx, "coredns", kubeadmConfig())
}

// InstallKubeProxy installs upstream kube-proxy as kubeadm does (kubeadm
// init phase addon kube-proxy: its DaemonSet of
// registry.k8s.io/kube-proxy, ConfigMap and RBAC) in mode (iptables,
// ipvs or nftables), the reference kpr is measured against.
func (c *Cluster) InstallKubeProxy(ctx context.Context, mode string) error {
	return c.kubeadmAddon(ctx, "kube-proxy", c.kubeProxyConfig(mode))
}

// kubeadmAddon runs kubeadm's phase for addon with the configuration
// config.
func (c *Cluster) kubeadmAddon(ctx context.Context, addon, config string) error {
	cfg := filepath.Join(c.WorkDir(), "kubeadm-"+addon+".yaml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		return err
	}
	_, err := c.Run(ctx, "kubeadm", "init", "phase", "addon", addon, "--config", cfg, "--kubeconfig", c.KubeconfigPath)
	return err
}

// Run runs one of the cluster's tools (kubectl, helm, kubeadm, ...) on the
// host with the admin's kubeconfig in KUBECONFIG and returns its output.
func (c *Cluster) Run(ctx context.Context, tool string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.toolsDir, tool), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.KubeconfigPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// WaitRollout waits until kubectl rollout status reports the workload
// (deployment/NAME, daemonset/NAME) in namespace fully rolled out.
func (c *Cluster) WaitRollout(ctx context.Context, namespace, workload string, timeout time.Duration) error {
	_, err := c.Run(ctx, "kubectl", "-n", namespace, "rollout", "status", workload, "--timeout="+timeout.String())
	return err
}
