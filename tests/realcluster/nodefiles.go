package realcluster

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path"
	"slices"
	"strings"

	"github.com/kpr-io/kpr/tests/realcluster/nodeconfig"
)

// Where a node keeps what the host gives it.
const (
	nodePKIDir        = "/etc/kubernetes/pki"
	nodeKubeconfig    = "/etc/kubernetes/kubelet.conf"
	nodeKubeletConfig = "/etc/kubernetes/kubelet.yaml"
	containerdConfig  = "/etc/containerd/config.toml"
	containerdSocket  = "/run/containerd/containerd.sock"
	nodeImagesDir     = "/images"
	nodeBinDir        = "/usr/local/bin"
	nodeCNIBinDir     = "/opt/cni/bin"
)

// nodeSecrets are what the host's PKI issues a node: the cluster CA and
// the kubelet's client certificate (system:node:NAME).
type nodeSecrets struct {
	caCert, clientCert, clientKey []byte
}

// nodeConfig renders everything node n needs to join the cluster whose API
// server listens on apiPort at the control plane's address: a kubelet and
// containerd configured as kubeadm and containerd's defaults would on a
// cgroup v2 host, the bridge CNI for n's pod network, and routes to the
// other nodes' pods. images are the archives to import into containerd
// before the kubelet starts; registry, if not empty, is the cluster's
// registry (host:port), which containerd pulls registry.k8s.io, docker.io
// and ghcr.io images from instead.
func nodeConfig(n node, all []node, apiPort string, secrets nodeSecrets, images []string, registry string) (*nodeconfig.Config, error) {
	cni, err := cniConfig(n)
	if err != nil {
		return nil, err
	}
	cfg := &nodeconfig.Config{
		Hostname:  n.name,
		Interface: "eth0",
		Address:   fmt.Sprintf("%s/%d", n.address, clusterNet.Bits()),
		Gateway:   controlPlane.String(),
		Sysctls: map[string]string{
			// A node forwards between its pods and the network.
			"net.ipv4.ip_forward": "1",
		},
		// kpr's DaemonSet mounts /lib/modules (for the netfilter
		// fallbacks' modules), which every node has.
		Dirs: []string{"/lib/modules", "/var/lib/kubelet", "/var/lib/containerd", "/var/log"},
		Files: []nodeconfig.File{
			{Path: path.Join(nodePKIDir, "ca.crt"), Mode: 0o644, Data: string(secrets.caCert)},
			{Path: path.Join(nodePKIDir, "kubelet-client.crt"), Mode: 0o644, Data: string(secrets.clientCert)},
			{Path: path.Join(nodePKIDir, "kubelet-client.key"), Mode: 0o600, Data: string(secrets.clientKey)},
			{Path: nodeKubeconfig, Mode: 0o600, Data: kubeletKubeconfig(apiPort)},
			{Path: nodeKubeletConfig, Mode: 0o644, Data: kubeletConfig(n)},
			{Path: containerdConfig, Mode: 0o644, Data: containerdConfigTOML(registry != "")},
			{Path: "/etc/cni/net.d/10-bridge.conflist", Mode: 0o644, Data: cni},
			// The kubelet reads the users (its user-namespace ranges)
			// and the machine ID (the Node's systemUUID and machineID).
			{Path: "/etc/passwd", Mode: 0o644, Data: "root:x:0:0:root:/root:/bin/sh\n"},
			{Path: "/etc/group", Mode: 0o644, Data: "root:x:0:\n"},
			{Path: "/etc/machine-id", Mode: 0o444, Data: machineID(n.name) + "\n"},
			{Path: "/etc/hosts", Mode: 0o644, Data: "127.0.0.1 localhost\n::1 localhost\n" + n.address.String() + " " + n.name + "\n"},
			// The control plane's namespace serves no DNS: names outside
			// the cluster fail at once, as on an air-gapped node, and
			// CoreDNS's forward plugin has an upstream to name.
			{Path: "/etc/resolv.conf", Mode: 0o644, Data: "nameserver " + controlPlane.String() + "\n"},
		},
	}
	if registry != "" {
		cfg.Files = append(cfg.Files, mirrorFiles(registry)...)
	}
	for _, o := range all {
		if o.index != n.index {
			cfg.Routes = append(cfg.Routes, nodeconfig.Route{Dst: o.podCIDR.String(), Via: o.address.String()})
		}
	}
	cfg.Services = append(cfg.Services, nodeconfig.Service{
		Name:      "containerd",
		Args:      []string{path.Join(nodeBinDir, "containerd"), "--config", containerdConfig},
		ReadyPath: containerdSocket,
	})
	for _, img := range images {
		cfg.Services = append(cfg.Services, nodeconfig.Service{
			Name:    "import " + path.Base(img),
			Args:    []string{path.Join(nodeBinDir, "ctr"), "--address", containerdSocket, "-n", "k8s.io", "images", "import", "--local", path.Join(nodeImagesDir, path.Base(img))},
			Oneshot: true,
		})
	}
	cfg.Services = append(cfg.Services,
		// The archives are in the node's memory twice once imported.
		nodeconfig.Service{Name: "free archives", Args: []string{"/bin/rm", "-rf", nodeImagesDir}, Oneshot: true},
		nodeconfig.Service{
			Name: "kubelet",
			Args: []string{path.Join(nodeBinDir, "kubelet"),
				"--config=" + nodeKubeletConfig,
				"--kubeconfig=" + nodeKubeconfig,
				"--node-ip=" + n.address.String(),
				"--hostname-override=" + n.name,
				"--v=1"},
		})
	return cfg, nil
}

// kubeletKubeconfig reaches the API server at the control plane's address
// with the kubelet's client certificate.
func kubeletKubeconfig(apiPort string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: https://%s
    certificate-authority: %s/ca.crt
users:
- name: kubelet
  user:
    client-certificate: %s/kubelet-client.crt
    client-key: %s/kubelet-client.key
contexts:
- name: kubelet
  context: {cluster: cluster, user: kubelet}
current-context: kubelet
`, net.JoinHostPort(controlPlane.String(), apiPort), nodePKIDir, nodePKIDir, nodePKIDir)
}

// kubeletConfig is the kubelet's KubeletConfiguration: kubeadm's choices
// (webhook authentication and authorization, the cluster's DNS), cgroupfs
// (the node has no systemd), and the limits of a node whose disk is its
// memory: image garbage collection off (the images cannot be pulled again)
// and eviction thresholds that a tmpfs root does not trip.
func kubeletConfig(n node) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%s
clusterDNS: [%s]
clusterDomain: %s
resolvConf: /etc/resolv.conf
failSwapOn: false
podCIDR: %s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: "0%%", imagefs.available: "0%%", nodefs.inodesFree: "0%%"}
serializeImagePulls: false
runtimeRequestTimeout: 10m
`, nodePKIDir, containerdSocket, clusterDNSIP, clusterDomain, n.podCIDR)
}

// containerdConfigTOML is containerd 2's configuration: CRI with runc under
// cgroupfs, the pause image built here as the sandbox, the CNI plugins,
// and, with mirrors, the registry hosts in registryConfigDir.
func containerdConfigTOML(mirrors bool) string {
	if !mirrors {
		return containerdBaseConfig
	}
	return containerdBaseConfig + `
[plugins.'io.containerd.cri.v1.images'.registry]
  config_path = "` + registryConfigDir + `"
`
}

const containerdBaseConfig = `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "` + containerdSocket + `"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "` + pauseImage + `"

[plugins.'io.containerd.cri.v1.runtime']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = "` + nodeBinDir + `/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["` + nodeCNIBinDir + `"]
    conf_dir = "/etc/cni/net.d"
`

// registryConfigDir holds containerd's per-registry hosts.toml files.
const registryConfigDir = "/etc/containerd/certs.d"

// mirroredRegistries are the registries whose images the cluster's
// registry serves, with the server containerd would otherwise ask.
var mirroredRegistries = map[string]string{
	"registry.k8s.io": "https://registry.k8s.io",
	"docker.io":       "https://registry-1.docker.io",
	"ghcr.io":         "https://ghcr.io",
}

// mirrorFiles make containerd pull each of mirroredRegistries' images from
// the cluster's registry at addr, under a path that names the registry
// (hack/image/clusterregistry serves each image under its whole
// reference): registry.k8s.io/pause:3.10.2 is
// http://addr/v2/registry.k8s.io/pause/manifests/3.10.2.
func mirrorFiles(addr string) []nodeconfig.File {
	var files []nodeconfig.File
	for _, host := range slices.Sorted(maps.Keys(mirroredRegistries)) {
		files = append(files, nodeconfig.File{
			Path: path.Join(registryConfigDir, host, "hosts.toml"),
			Mode: 0o644,
			Data: fmt.Sprintf("server = %q\n\n[host.\"http://%s/v2/%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  override_path = true\n",
				mirroredRegistries[host], addr, host),
		})
	}
	return files
}

// pauseImage is the sandbox image, as kubeadm v1.37 and containerd 2.4 name it.
const pauseImage = "registry.k8s.io/pause:3.10.2"

// cniConfig is the bridge plugin's network for n's pods: cni0 as their
// gateway, addresses from n's pod CIDR, no masquerade (every node and the
// control plane route the pod networks), and portmap for hostPorts.
func cniConfig(n node) (string, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "kpr-test-pods",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": n.podCIDR.String()}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	return strings.TrimSpace(string(b)) + "\n", err
}

// machineID is a node's /etc/machine-id: 32 hex digits, stable for a name.
func machineID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return fmt.Sprintf("%x", sum[:16])
}
