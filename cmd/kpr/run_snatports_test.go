package main

import (
	"strings"
	"testing"
)

// kpr run refuses a SNAT port range that the node's ephemeral ports
// reach, naming both settings, and starts with one they do not; without
// the tc programs there is nothing to check.
func TestRunChecksSNATPortsAgainstTheNode(t *testing.T) {
	node := func(r string) func(string) (string, error) {
		return func(name string) (string, error) {
			if name != "net.ipv4.ip_local_port_range" {
				t.Errorf("kpr read sysctl %s", name)
			}
			return r, nil
		}
	}
	for _, tc := range []struct {
		flags runFlags
		local string
		ok    bool
	}{
		{runFlags{ebpf: ebpfFlags{tcAttach: "auto"}}, "32768\t60999", true},
		{runFlags{ebpf: ebpfFlags{tcAttach: "auto"}}, "10000\t60999", false}, // reaches the default range
		{runFlags{ebpf: ebpfFlags{tcAttach: "auto", snatPorts: "40000-40100"}}, "32768\t60999", false},
		{runFlags{ebpf: ebpfFlags{tcAttach: "auto", snatPorts: "40000-40100"}}, "50000\t60999", true},
		{runFlags{ebpf: ebpfFlags{tcAttach: "none"}}, "1024\t65535", true},
	} {
		err := checkSNATPorts(&tc.flags, node(tc.local))
		if tc.ok && err != nil {
			t.Errorf("--snat-port-range %q, ip_local_port_range %q: %v", tc.flags.ebpf.snatPorts, tc.local, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "ip_local_port_range") || !strings.Contains(err.Error(), "--snat-port-range")) {
			t.Errorf("--snat-port-range %q, ip_local_port_range %q: error %v, want a refusal naming both settings", tc.flags.ebpf.snatPorts, tc.local, err)
		}
	}
}
