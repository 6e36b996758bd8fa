package ebpfplane

import (
	"fmt"
	"path/filepath"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
)

// Link is one of kpr's pinned links, for `kpr status`: which program it
// runs and where.
type Link struct{ loader.LinkStatus }

// Columns are the pin's name, the attach type, the program and where it
// runs; or the pin's name and why it could not be read.
func (l Link) Columns() []string {
	if l.Error != "" {
		return []string{filepath.Base(l.Pin), "error: " + l.Error}
	}
	return []string{filepath.Base(l.Pin), l.Type, "program " + l.Program, l.attachedTo()}
}

// attachedTo says where the link's program runs.
func (l Link) attachedTo() string {
	switch {
	case l.CgroupID != 0 && l.Cgroup != "":
		return fmt.Sprintf("cgroup %s (id %d)", l.Cgroup, l.CgroupID)
	case l.CgroupID != 0:
		return fmt.Sprintf("cgroup id %d", l.CgroupID)
	case l.Ifindex != 0 && l.Device != "":
		return fmt.Sprintf("device %s (ifindex %d)", l.Device, l.Ifindex)
	case l.Ifindex != 0:
		return fmt.Sprintf("ifindex %d (not in this network namespace: give --host-netns)", l.Ifindex)
	}
	return "-"
}

// InspectLinks reads the links pinned under bpfRoot, naming a tcx link's
// device as the network namespace at netnsPath (this one if empty) names
// it. It is apart from the Inspector, which needs the maps: a link whose
// maps are gone still runs its program, and `kpr status` shows it
// whichever mode's state it reads.
func InspectLinks(bpfRoot, netnsPath string) dataplane.Inspection {
	return LinkInspection(bpfRoot, loader.PinnedLinks(bpfRoot, netnsPath))
}

// LinkInspection is the reading of the links pinned under bpfRoot.
func LinkInspection(bpfRoot string, links []loader.LinkStatus) dataplane.Inspection {
	in := dataplane.Inspection{Key: "links", Title: "links under " + bpfRoot, Rows: []dataplane.InspectedRow{},
		None: "(none pinned: no kpr program is attached through the pins)"}
	for _, l := range links {
		in.Rows = append(in.Rows, Link{l})
	}
	return in
}
