package main

import (
	"strings"
	"testing"
)

func TestLBAlgorithmFlags(t *testing.T) {
	ok := []runFlags{
		{lbAlgorithm: "random", tcAttach: "auto"},
		{lbAlgorithm: "maglev", tcAttach: "auto", maglevTableSize: 16381}, // the detected devices
		{lbAlgorithm: "maglev", devices: []string{"eth0"}, tcAttach: "auto", maglevTableSize: 16381},
		{lbAlgorithm: "maglev", devices: []string{"eth0"}, tcAttach: "auto", maglevTableSize: 251},
	}
	for _, f := range ok {
		opts, err := f.tcOptions()
		if err != nil {
			t.Errorf("--lb-algorithm %s --maglev-table-size %d: %v", f.lbAlgorithm, f.maglevTableSize, err)
			continue
		}
		if len(f.devices) > 0 && opts.MaglevTableSize != f.maglevTableSize {
			t.Errorf("--maglev-table-size %d: the tc programs get %d", f.maglevTableSize, opts.MaglevTableSize)
		}
	}
	for want, f := range map[string]runFlags{
		"--lb-algorithm":      {lbAlgorithm: "roundrobin", devices: []string{"eth0"}},
		"--tc-attach none":    {lbAlgorithm: "maglev", tcAttach: "none", maglevTableSize: 16381},
		"not prime":           {lbAlgorithm: "maglev", devices: []string{"eth0"}, maglevTableSize: 16383},
		"--maglev-table-size": {lbAlgorithm: "maglev", devices: []string{"eth0"}, maglevTableSize: 31},
	} {
		if _, err := f.tcOptions(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--lb-algorithm %s --maglev-table-size %d --devices %v: error %v, want one saying %q", f.lbAlgorithm, f.maglevTableSize, f.devices, err, want)
		}
	}
}
