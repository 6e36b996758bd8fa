package nftables

import "testing"

func TestKernelSupports(t *testing.T) {
	for release, ok := range map[string]bool{
		"5.10.0-28-amd64": false, "5.12.19": false, "5.13.0": true, "5.15.0-91-generic": true,
		"6.1.0-18-cloud-amd64": true, "4.19.0": false, "6.8": true, "garbage": false,
	} {
		if err := KernelSupports(release); (err == nil) != ok {
			t.Errorf("KernelSupports(%q) = %v, want ok %v", release, err, ok)
		}
	}
}
