package migration

import (
	"strings"
	"testing"
)

// TestCleanupKubeProxy: after a real kube-proxy programmed the node in
// iptables and in nftables mode and was stopped, `kpr cleanup
// --kube-proxy` leaves none of its state, and the Service is no longer
// served.
func TestCleanupKubeProxy(t *testing.T) {
	f := newFixture(t)
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			kp := f.startKubeProxy(mode)
			if err := kp.Stop(); err != nil {
				t.Fatal(err)
			}
			if left := f.kubeProxyState(); len(left) == 0 {
				t.Fatalf("kube-proxy in %s mode left nothing to clean: the test would prove nothing", mode)
			}
			out := f.cleanupKubeProxy()
			t.Logf("kpr cleanup --kube-proxy:\n%s", out)
			if left := f.kubeProxyState(); len(left) > 0 {
				t.Fatalf("kube-proxy state left after kpr cleanup --kube-proxy:\n%s", strings.Join(left, "\n"))
			}
			if err := f.checkNewConnections(); err == nil {
				t.Fatal("the Service is still served after the cleanup, with no proxy running")
			}
		})
	}
}
