package loader

import (
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/netnsexec"
)

// Reading the pinned links back, for `kpr status`: which program each
// runs and where it is attached, named as the node names it.

// LinkStatus is one pinned link of kpr's.
type LinkStatus struct {
	Pin      string `json:"pin"`
	Type     string `json:"type"` // the attach type, for a cgroup or tcx link
	Program  string `json:"program"`
	CgroupID uint64 `json:"cgroupId,omitempty"`
	// Cgroup is the cgroup's path under the cgroup2 mount, when found.
	Cgroup string `json:"cgroup,omitempty"`
	// Ifindex and Device are a tcx link's device (the name as found in
	// the network namespace given to PinnedLinks).
	Ifindex uint32 `json:"ifindex,omitempty"`
	Device  string `json:"device,omitempty"`
	Error   string `json:"error,omitempty"`
}

// PinnedLinks lists the links kpr pinned under bpfRoot, with the program
// each runs and the cgroup or device it is attached to; a tcx link's
// device is named as the network namespace at netnsPath (this one if
// empty) names it. A link that cannot be read says why in its Error.
func PinnedLinks(bpfRoot, netnsPath string) []LinkStatus {
	out := []LinkStatus{}
	cgroups := cgroupPaths{}
	pins, _ := filepath.Glob(filepath.Join(linkDir(bpfRoot), "*"))
	sort.Strings(pins)
	for _, pin := range pins {
		ls := LinkStatus{Pin: pin}
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			ls.Error = err.Error()
			out = append(out, ls)
			continue
		}
		if info, err := l.Info(); err != nil {
			ls.Error = err.Error()
		} else {
			if c := info.Cgroup(); c != nil {
				ls.Type = ebpf.AttachType(c.AttachType).String()
				ls.CgroupID = c.CgroupId
				ls.Cgroup = cgroups.path(c.CgroupId)
			} else if tc := info.TCX(); tc != nil {
				ls.Type = ebpf.AttachType(tc.AttachType).String()
				ls.Ifindex = tc.Ifindex
				ls.Device = DeviceName(netnsPath, tc.Ifindex)
			} else {
				ls.Type = fmt.Sprintf("link type %d", info.Type)
			}
			if p, err := ebpf.NewProgramFromID(info.Program); err == nil {
				if pi, err := p.Info(); err == nil {
					ls.Program = pi.Name
				}
				p.Close()
			}
		}
		l.Close()
		out = append(out, ls)
	}
	return out
}

// cgroupPaths finds cgroups by id (a cgroup2 directory's inode number),
// remembering each it looked for: several links share a cgroup.
type cgroupPaths map[uint64]string

func (c cgroupPaths) path(id uint64) string {
	if p, ok := c[id]; ok {
		return p
	}
	root, err := FindCgroup2Mount()
	if err != nil {
		return ""
	}
	found := ""
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && st.Ino == id {
			found = path
			return fs.SkipAll
		}
		return nil
	})
	c[id] = found
	return found
}

// DeviceName is the name of the device ifindex in the network namespace
// at netnsPath (this one if empty), "" if there is none.
func DeviceName(netnsPath string, ifindex uint32) string {
	name := ""
	lookup := func() error {
		if iface, err := net.InterfaceByIndex(int(ifindex)); err == nil {
			name = iface.Name
		}
		return nil
	}
	if netnsPath == "" {
		_ = lookup()
	} else {
		_ = netnsexec.InPath(netnsPath, lookup)
	}
	return name
}
