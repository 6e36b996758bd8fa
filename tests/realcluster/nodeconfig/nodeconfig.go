// Package nodeconfig is what the host tells a node VM of the real test
// cluster (tests/realcluster) about itself: its name and addresses, the
// files it must have (kubeconfigs, certificates, the kubelet's, containerd's
// and the CNI's configuration) and the services to run. The host renders
// it; the VM's init (tests/realcluster/nodeinit) only carries it out, so
// the knowledge of how a node is set up lives on the host, where it is
// testable without a VM.
//
// It reaches the VM through qemu's fw_cfg device, as the file Path below.
package nodeconfig

import (
	"encoding/json"
	"fmt"
	"os"
)

// FwCfgName is the fw_cfg entry the host passes the Config in
// (-fw_cfg name=FwCfgName,file=...); Path is where the VM's kernel shows it.
const (
	FwCfgName = "opt/kpr/node.json"
	Path      = "/sys/firmware/qemu_fw_cfg/by_name/" + FwCfgName + "/raw"
)

// Config is one node.
type Config struct {
	// Hostname is the node's host name, and its Node's name.
	Hostname string `json:"hostname"`
	// Interface is the NIC to configure (eth0 of a single virtio NIC).
	Interface string `json:"interface"`
	// Address is the node's address on the cluster network, as a CIDR.
	Address string `json:"address"`
	// Gateway is the default route's next hop: the control-plane host.
	Gateway string `json:"gateway"`
	// Routes reach the other nodes' pod networks.
	Routes []Route `json:"routes,omitempty"`
	// Sysctls are set before any service starts (name with dots).
	Sysctls map[string]string `json:"sysctls,omitempty"`
	// Dirs are made before the files are written.
	Dirs []string `json:"dirs,omitempty"`
	// Files are written before any service starts.
	Files []File `json:"files,omitempty"`
	// Services run in order: each starts once the one before is ready.
	Services []Service `json:"services"`
}

// Route is a static route.
type Route struct {
	Dst string `json:"dst"`
	Via string `json:"via"`
}

// File is a file the node needs.
type File struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Data string `json:"data"`
}

// Service is a program the node runs.
type Service struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	// Oneshot services run to completion before the next starts (an
	// image import); the others run for the VM's life and are restarted
	// when they exit, as systemd would.
	Oneshot bool `json:"oneshot,omitempty"`
	// ReadyPath, for a long-running service, is a file (a socket) whose
	// existence means it is ready for the next service.
	ReadyPath string `json:"readyPath,omitempty"`
}

// Load reads the Config at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the node's configuration: %w", err)
	}
	var c Config
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("parsing the node's configuration %s: %w", path, err)
	}
	return &c, nil
}
