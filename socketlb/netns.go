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
}

// maxPodCgroupDepth bounds the search below CgroupRoot: the kubelet's pod
// cgroups sit two or three levels below its own root (kubepods, the QoS
// class, the pod), which may itself be a few levels down.
const maxPodCgroupDepth = 6

// Cookie returns the cookie of the pod's network namespace and the cgroup
// it was found through.
func (p PodNamespaces) Cookie(uid types.UID) (uint64, string, error) {
	dir, err := p.podCgroup(uid)
	if err != nil {
		return 0, "", err
	}
	pid, err := firstProcess(dir)
	if err != nil {
		return 0, dir, err
	}
	proc := p.Proc
	if proc == "" {
		proc = "/proc"
	}
	cookie, err := p.NetNSCookie(filepath.Join(proc, strconv.Itoa(pid), "ns", "net"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, dir, fmt.Errorf("%w: process %d of cgroup %s exited", ErrNotYet, pid, dir)
	}
	if err != nil {
		return 0, dir, fmt.Errorf("network namespace of pod %s (process %d of cgroup %s): %w", uid, pid, dir, err)
	}
	return cookie, dir, nil
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
