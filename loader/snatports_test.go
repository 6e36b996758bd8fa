package loader

import (
	"errors"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/bpf"
)

// fakeSysctls reads sysctls from a map, as the node would show them.
func fakeSysctls(values map[string]string) SysctlReader {
	return func(name string) (string, error) {
		v, ok := values[name]
		if !ok {
			return "", errors.New("no such sysctl")
		}
		return v, nil
	}
}

func TestCheckSNATPortsAgainstTheEphemeralRange(t *testing.T) {
	snat := PortRange{First: 61000, Last: 65535}
	for _, tc := range []struct {
		local string
		ok    bool
	}{
		{"32768\t60999", true}, // the kernel's default
		{"1024 60999", true},
		{"32768\t61000", false}, // touches the first SNAT port
		{"32768 65535", false},
		{"61500 62000", false}, // inside
		{"65535 65535", false},
		{"1024 1024", true},
	} {
		err := CheckSNATPorts(snat, fakeSysctls(map[string]string{"net.ipv4.ip_local_port_range": tc.local}))
		if tc.ok && err != nil {
			t.Errorf("ip_local_port_range %q: %v", tc.local, err)
		}
		if !tc.ok {
			if err == nil {
				t.Errorf("ip_local_port_range %q overlaps %s, not refused", tc.local, snat)
			} else if !strings.Contains(err.Error(), "net.ipv4.ip_local_port_range") || !strings.Contains(err.Error(), "--snat-port-range") {
				t.Errorf("ip_local_port_range %q: the error names neither setting to change: %v", tc.local, err)
			}
		}
	}
}

// A range kpr cannot read or make sense of fails the check: kpr would
// otherwise start with ports it cannot vouch for.
func TestCheckSNATPortsUnreadable(t *testing.T) {
	snat := PortRange{First: 61000, Last: 65535}
	if err := CheckSNATPorts(snat, fakeSysctls(nil)); err == nil {
		t.Error("an unreadable ip_local_port_range passed the check")
	}
	if err := CheckSNATPorts(snat, fakeSysctls(map[string]string{"net.ipv4.ip_local_port_range": "many"})); err == nil {
		t.Error("a garbled ip_local_port_range passed the check")
	}
}

// The default range is the object's own, wherever the C side sets it, and
// a configured range wins over it.
func TestSNATPortRangeFromTheObject(t *testing.T) {
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	var lo, hi uint16
	if err := spec.Variables[bpf.TcNodeportVarSnatPortMin].Get(&lo); err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[bpf.TcNodeportVarSnatPortMax].Get(&hi); err != nil {
		t.Fatal(err)
	}
	got, err := TCOptions{}.SNATPortRange()
	if err != nil {
		t.Fatal(err)
	}
	if got != (PortRange{First: lo, Last: hi}) || lo == 0 || hi < lo {
		t.Errorf("default SNAT range %s, the object has %d-%d", got, lo, hi)
	}
	got, err = TCOptions{SNATPorts: [2]uint16{40000, 40100}}.SNATPortRange()
	if err != nil || got != (PortRange{First: 40000, Last: 40100}) {
		t.Errorf("configured 40000-40100: got %s, %v", got, err)
	}
}

// The reader reads the namespace's own value (this test's namespace, read
// only): the kernel's file has two numbers.
func TestNetNSSysctlReaderReadsTheRange(t *testing.T) {
	v, err := NetNSSysctlReader("")("net.ipv4.ip_local_port_range")
	if err != nil {
		t.Fatal(err)
	}
	if len(strings.Fields(v)) != 2 {
		t.Errorf("ip_local_port_range reads %q", v)
	}
}
