package dataplane

import "strings"

// Inspector is optional beside Dataplane: a backend that implements it
// answers `kpr explain` and `kpr status` itself, from what the node's
// kernel holds. Those commands run apart from the daemon, so a backend's
// Inspector reads the node (pinned maps, the tables), not a running
// Dataplane's memory; cmd/kpr builds it through the mode table.
type Inspector interface {
	// InspectPorts reports what the dataplane holds for ports, one row
	// per frontend, and every way that differs from what the backend
	// writes for them.
	InspectPorts(ports []ServicePort) (Inspection, error)
	// InspectNode reports the backend's tables on the node and their
	// fill, one Inspection per kind of table. A kind that cannot be read
	// says why in its Error; the others are still reported.
	InspectNode() []Inspection
	// Close releases what the reading holds (map handles, netlink
	// sockets).
	Close()
}

// Inspection is one backend's reading of one kind of its state.
type Inspection struct {
	// Key names Rows in the commands' JSON output: "maps", "rules",
	// "virtualServers".
	Key string
	// Title heads Rows in the commands' table output.
	Title string
	// Header, if any, names the columns of Rows.
	Header []string
	// Rows are the backend's own records, encoded as JSON as they are
	// and written for people by their Columns method.
	Rows []InspectedRow
	// None, if set, is the table output's line for no rows ("none
	// pinned"), where an empty table would leave the reader guessing.
	None string
	// Error says why the rows could not be read.
	Error string
	// Divergences name every difference between what the dataplane holds
	// and what the backend writes; set by InspectPorts only, empty when
	// they agree.
	Divergences []string
	// Agrees is the sentence for no divergences, in the backend's terms
	// ("the maps hold exactly what kpr wants for this Service").
	Agrees string
}

// InspectedRow is one row of an Inspection: a frontend, a map, a family's
// chains.
type InspectedRow interface {
	// Columns are the row for people, aligned with the other rows'.
	Columns() []string
}

// DescribeBackends says where new connections go, for an inspection's
// rows: the backends, or that there are none.
func DescribeBackends(bs []string) string {
	if len(bs) == 0 {
		return "(none: connections are refused)"
	}
	return strings.Join(bs, " ")
}

// BackendStrings spells backends as address:port, for an inspection's
// rows.
func BackendStrings(bs []Backend) []string {
	out := make([]string, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.String())
	}
	return out
}
