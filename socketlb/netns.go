package socketlb

import (
	"github.com/kpr-io/kpr/cgroupprocs"

	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// ErrNotYet is returned for a pod whose cgroup or processes the node does
// not have yet: the kubelet creates the pod's cgroup, and the runtime its
// sandbox, after the Pod is bound to the node. Ask again later.
var ErrNotYet = errors.New("the pod has no cgroup or no process on this node yet")

// PodNamespaces finds the network namespace of a pod on this node, from
// its UID: the kubelet names each pod's cgroup after the UID
// (kubepods/burstable/pod<uid> with the cgroupfs driver,
// kubepods-burstable-pod<uid_with_underscores>.slice with systemd's), every
// process of the pod sits in that cgroup or below it, and every container
// of a pod shares the sandbox's network namespace. It needs the node's
// process IDs (hostPID) to open a process's namespace.
type PodNamespaces struct {
	// CgroupRoot is the cgroup v2 directory the pods' cgroups are under:
	// kpr's --cgroup-root.
	CgroupRoot string
	// Proc is the node's procfs; "" means /proc.
	Proc string
	// NetNSCookie reads a network namespace's cookie from its path (a
	// /proc/PID/ns/net file): loader.NetNSCookie.
	NetNSCookie func(path string) (uint64, error)
	// NodeNetNS is the node's network namespace (kpr's --host-netns), ""
	// for kpr's own: where the pods' veths have their other ends.
	NodeNetNS string
}

// PodNetwork is what the node has of a pod's network.
type PodNetwork struct {
	// Cookie is the pod's network namespace's, which the socket hooks
	// know it by.
	Cookie uint64
	// Cgroup is the pod's cgroup the namespace was found through.
	Cgroup string
	// Devices are the node's ends of the pod's veths, where the packet
	// path's programs go.
	Devices []string
}

// maxPodCgroupDepth bounds the search below CgroupRoot: the kubelet's pod
// cgroups sit two or three levels below its own root (kubepods, the QoS
// class, the pod), which may itself be a few levels down.
const maxPodCgroupDepth = 6

// Find returns the pod's network: its namespace's cookie, through its
// cgroup, and the node's ends of its veths.
func (p PodNamespaces) Find(uid types.UID) (PodNetwork, error) {
	dir, err := p.podCgroup(uid)
	if err != nil {
		return PodNetwork{}, err
	}
	found := PodNetwork{Cgroup: dir}
	pid, err := firstProcess(dir)
	if err != nil {
		return found, err
	}
	proc := p.Proc
	if proc == "" {
		proc = "/proc"
	}
	path := filepath.Join(proc, strconv.Itoa(pid), "ns", "net")
	found.Cookie, err = p.NetNSCookie(path)
	if errors.Is(err, fs.ErrNotExist) {
		return found, fmt.Errorf("%w: process %d of cgroup %s exited", ErrNotYet, pid, dir)
	}
	if err != nil {
		return found, fmt.Errorf("network namespace of pod %s (process %d of cgroup %s): %w", uid, pid, dir, err)
	}
	if found.Devices, err = nodeDevices(path, p.NodeNetNS); err != nil {
		return found, fmt.Errorf("the node's end of pod %s's interfaces: %w", uid, err)
	}
	return found, nil
}

// podCgroup finds the cgroup directory named after uid.
func (p PodNamespaces) podCgroup(uid types.UID) (string, error) {
	names := []string{"pod" + string(uid), "pod" + strings.ReplaceAll(string(uid), "-", "_")}
	root := filepath.Clean(p.CgroupRoot)
	var found string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == root {
				return err
			}
			return fs.SkipDir // a cgroup removed while walking
		}
		if !d.IsDir() {
			return nil
		}
		if strings.Count(strings.TrimPrefix(path, root), string(filepath.Separator)) > maxPodCgroupDepth {
			return fs.SkipDir
		}
		base := d.Name()
		for _, n := range names {
			// "pod<uid>" or "kubepods-burstable-pod<uid>.slice".
			if base == n || (strings.HasSuffix(base, n+".slice") && strings.HasPrefix(base, "kubepods")) {
				found = path
				return fs.SkipAll
			}
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("look for the cgroup of pod %s under %s: %w", uid, root, err)
	}
	if found == "" {
		return "", fmt.Errorf("%w: no cgroup named after pod %s under %s", ErrNotYet, uid, root)
	}
	return found, nil
}

// firstProcess returns a process of the cgroup dir or of a cgroup below
// it: a pod's processes sit in its containers' cgroups.
func firstProcess(dir string) (int, error) {
	pids, err := cgroupprocs.PIDs(dir)
	if err != nil {
		return 0, err
	}
	if len(pids) == 0 {
		return 0, fmt.Errorf("%w: cgroup %s has no process that kpr can see (kpr needs hostPID)", ErrNotYet, dir)
	}
	return pids[0], nil
}
