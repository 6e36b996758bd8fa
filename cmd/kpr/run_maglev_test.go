package main

import (
	"strings"
	"testing"
)

func TestLBAlgorithmFlags(t *testing.T) {
	ok := []runFlags{
		{ebpf: ebpfFlags{lbAlgorithm: "random", tcAttach: "auto"}},
		{ebpf: ebpfFlags{lbAlgorithm: "maglev", tcAttach: "auto", maglevTableSize: 16381}}, // the detected devices
		{ebpf: ebpfFlags{lbAlgorithm: "maglev", devices: []string{"eth0"}, tcAttach: "auto", maglevTableSize: 16381}},
		{ebpf: ebpfFlags{lbAlgorithm: "maglev", devices: []string{"eth0"}, tcAttach: "auto", maglevTableSize: 251}},
	}
	for _, f := range ok {
		opts, err := f.tcOptions()
		if err != nil {
			t.Errorf("--lb-algorithm %s --maglev-table-size %d: %v", f.ebpf.lbAlgorithm, f.ebpf.maglevTableSize, err)
			continue
		}
		if len(f.ebpf.devices) > 0 && opts.MaglevTableSize != f.ebpf.maglevTableSize {
			t.Errorf("--maglev-table-size %d: the tc programs get %d", f.ebpf.maglevTableSize, opts.MaglevTableSize)
		}
	}
	for want, f := range map[string]runFlags{
		"--lb-algorithm":      {ebpf: ebpfFlags{lbAlgorithm: "roundrobin", devices: []string{"eth0"}}},
		"--tc-attach none":    {ebpf: ebpfFlags{lbAlgorithm: "maglev", tcAttach: "none", maglevTableSize: 16381}},
		"not prime":           {ebpf: ebpfFlags{lbAlgorithm: "maglev", devices: []string{"eth0"}, maglevTableSize: 16383}},
		"--maglev-table-size": {ebpf: ebpfFlags{lbAlgorithm: "maglev", devices: []string{"eth0"}, maglevTableSize: 31}},
	} {
		if _, err := f.tcOptions(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--lb-algorithm %s --maglev-table-size %d --devices %v: error %v, want one saying %q", f.ebpf.lbAlgorithm, f.ebpf.maglevTableSize, f.ebpf.devices, err, want)
		}
	}
}
