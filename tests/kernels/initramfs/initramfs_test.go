package initramfs

import (
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// Where the host has iptables, the plugins its rules load at run time are
// found: without libxt_comment.so a VM's iptables fails every rule with a
// comment (the portmap CNI plugin's and kpr's own).
func TestXtablesPluginsHasTheMatchesRulesUse(t *testing.T) {
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("skipping: this machine has no iptables (hack/deps.sh installs it)")
	}
	var names []string
	for _, p := range XtablesPlugins() {
		names = append(names, filepath.Base(p))
	}
	for _, want := range []string{"libxt_comment.so", "libxt_MARK.so", "libxt_mark.so"} {
		if !slices.Contains(names, want) {
			t.Errorf("XtablesPlugins() lacks %s: %v", want, names)
		}
	}
}
