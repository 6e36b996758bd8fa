package netfilter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without br_netfilter, or with its sysctl off, the netfilter modes say
// what to do about it; with it on they say nothing.
func TestCheckBridgeNetfilter(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bridge-nf-call-iptables")
	if err := CheckBridgeNetfilter(path); err == nil || !strings.Contains(err.Error(), "modprobe br_netfilter") {
		t.Errorf("module not loaded: err = %v, want it to say to load br_netfilter", err)
	}
	for value, wantErr := range map[string]bool{"0\n": true, "1\n": false} {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
		err := CheckBridgeNetfilter(path)
		if (err != nil) != wantErr || (err != nil && !strings.Contains(err.Error(), "sysctl net.bridge.bridge-nf-call-iptables=1")) {
			t.Errorf("sysctl %q: err = %v, want an error: %v", strings.TrimSpace(value), err, wantErr)
		}
	}
}
