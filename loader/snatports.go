package loader

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/netnsexec"
)

// PortRange is a range of ports, first to last, both included.
type PortRange struct {
	First, Last uint16
}

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

func (r PortRange) overlaps(o PortRange) bool { return r.First <= o.Last && o.First <= r.Last }

// DefaultSNATPorts is the range SNATed flows get without
// TCOptions.SNATPorts: the one compiled into the tc programs
// (snat_port_min and snat_port_max in bpf/nat.h), read from the embedded
// object so that Go holds no copy of it.
var DefaultSNATPorts = sync.OnceValues(func() (PortRange, error) {
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		return PortRange{}, fmt.Errorf("parse embedded BPF object: %w", err)
	}
	var r PortRange
	for _, v := range []struct {
		name string
		out  *uint16
	}{{bpf.TcNodeportVarSnatPortMin, &r.First}, {bpf.TcNodeportVarSnatPortMax, &r.Last}} {
		vs, ok := spec.Variables[v.name]
		if !ok {
			return PortRange{}, fmt.Errorf("the tc programs lack variable %s (run make generate)", v.name)
		}
		if err := vs.Get(v.out); err != nil {
			return PortRange{}, fmt.Errorf("read the tc programs' %s: %w", v.name, err)
		}
	}
	return r, nil
})

// SNATPortRange is the range SNATed flows get under opts.
func (opts TCOptions) SNATPortRange() (PortRange, error) {
	if opts.SNATPorts != [2]uint16{} {
		return PortRange{First: opts.SNATPorts[0], Last: opts.SNATPorts[1]}, nil
	}
	return DefaultSNATPorts()
}

// SysctlReader reads a sysctl by its dotted name (net.ipv4.ip_local_port_range).
type SysctlReader func(name string) (string, error)

// NetNSSysctlReader reads sysctls in the network namespace at netnsPath
// (a /proc/PID/ns/net file or a bind mount; empty for the caller's own).
// It only reads: kpr never writes a host sysctl.
func NetNSSysctlReader(netnsPath string) SysctlReader {
	return func(name string) (string, error) {
		path := "/proc/sys/" + strings.ReplaceAll(name, ".", "/")
		var b []byte
		read := func() (err error) {
			b, err = os.ReadFile(path)
			return err
		}
		var err error
		if netnsPath == "" {
			err = read()
		} else {
			// /proc/sys/net shows the namespace of the thread that
			// opens it.
			err = netnsexec.InPath(netnsPath, read)
		}
		if err != nil {
			return "", fmt.Errorf("read sysctl %s: %w", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
}

// localPortRangeSysctl is the node's ephemeral port range, from which
// its own sockets bind (IPv4 and IPv6 alike).
const localPortRangeSysctl = "net.ipv4.ip_local_port_range"

// CheckSNATPorts refuses a SNAT range that overlaps the node's ephemeral
// ports (read through read, in the node's network namespace). The tc
// programs pick a SNATed flow's port without the kernel knowing: a node's
// own connection to the same backend from the same port would share the
// flow's addresses and ports, and the backend's replies would reach the
// wrong one.
func CheckSNATPorts(snat PortRange, read SysctlReader) error {
	raw, err := read(localPortRangeSysctl)
	if err != nil {
		return fmt.Errorf("check the SNAT port range %s against the node's ephemeral ports: %w", snat, err)
	}
	var local PortRange
	if _, err := fmt.Sscanf(raw, "%d %d", &local.First, &local.Last); err != nil {
		return fmt.Errorf("check the SNAT port range %s against the node's ephemeral ports: %s is %q, not two port numbers",
			snat, localPortRangeSysctl, raw)
	}
	if !snat.overlaps(local) {
		return nil
	}
	return fmt.Errorf("the SNAT port range %s of the tc programs overlaps the node's %s %s: the node's own connections "+
		"could take ports kpr gives flows to backends on other nodes, and replies would reach the wrong connection. "+
		"Move %s off it on the node (its upper bound below %d, or its lower bound above %d), or give kpr run "+
		"--snat-port-range a range outside %s", snat, localPortRangeSysctl, local, localPortRangeSysctl, snat.First, snat.Last, local)
}
