package e2e

import (
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kpr-io/kpr/tests/harness"
	"github.com/kpr-io/kpr/tests/kprproc"
)

// TestProxyMode: kpr says which backend runs, where kube-proxy does
// (/proxyMode on the metrics address) and in its log.
func TestProxyMode(t *testing.T) {
	f := newFixture(t)
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + f.kpr.MetricsAddr + "/proxyMode")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != "ebpf" {
		t.Errorf("/proxyMode = %d %q, %v; want 200 \"ebpf\"", resp.StatusCode, body, err)
	}
	var selected string
	for _, line := range strings.Split(f.kpr.Log(), "\n") {
		if strings.Contains(line, "dataplane selected") {
			selected = line
		}
	}
	for _, want := range []string{`"mode": "auto"`, `"backend": "ebpf"`, `"reason"`} {
		if !strings.Contains(selected, want) {
			t.Errorf("kpr's log line %q lacks %s", selected, want)
		}
	}
}

// TestModesNotBuiltAreRefused: --mode iptables and ipvs fail at once,
// before kpr touches the API server or the kernel's hooks, with a message
// that points at what works instead of at another refused mode.
func TestModesNotBuiltAreRefused(t *testing.T) {
	harness.RequireRoot(t)
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"iptables", "ipvs", "userspace"} {
		// No kubeconfig and no API server: the mode is refused first.
		out, err := exec.Command(bin, "run", "--mode", mode, "--hostname-override", "n",
			"--kubeconfig", "/nonexistent", "--bpf-root", "/nonexistent/kpr", "--cgroup-root", "/nonexistent").CombinedOutput()
		if err == nil {
			t.Fatalf("kpr run --mode %s succeeded:\n%s", mode, out)
		}
		msg := string(out)
		want := "only the eBPF dataplane"
		if mode == "userspace" {
			want = "want auto or ebpf"
		}
		if !strings.Contains(msg, "--mode") || !strings.Contains(msg, want) {
			t.Errorf("kpr run --mode %s said %q, want it to name the flag and %q", mode, msg, want)
		}
		for _, refused := range []string{"iptables", "ipvs"} {
			if refused != mode && strings.Contains(msg, "--mode "+refused) {
				t.Errorf("kpr run --mode %s suggests --mode %s, which it refuses too: %q", mode, refused, msg)
			}
		}
	}
}
