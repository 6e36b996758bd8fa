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
	// --mode auto ran eBPF because the kernel can: the metric says both.
	if v, err := f.kpr.Metric(`kpr_proxy_mode{mode="ebpf",reason="ebpf-supported"}`); err != nil || v != "1" {
		t.Errorf("kpr_proxy_mode for auto on this kernel = %q, %v; want 1", v, err)
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

// TestModesNotBuiltAreRefused: unknown modes and fallbacks fail at once, before kpr touches the API server or the
// kernel's hooks, with a message that points at what works instead of at
// another refused mode.
func TestModesNotBuiltAreRefused(t *testing.T) {
	harness.RequireRoot(t)
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--mode", "userspace"}, "want auto, ebpf, iptables, ipvs or nftables"},
		{[]string{"--fallback-mode", "ebpf"}, "want auto, iptables, ipvs or nftables"},
	} {
		// No kubeconfig and no API server: the mode is refused first.
		args := append([]string{"run", "--hostname-override", "n",
			"--kubeconfig", "/nonexistent", "--bpf-root", "/nonexistent/kpr", "--cgroup-root", "/nonexistent"}, tc.flags...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil {
			t.Fatalf("kpr run %v succeeded:\n%s", tc.flags, out)
		}
		msg := string(out)
		if !strings.Contains(msg, tc.flags[len(tc.flags)-2]) || !strings.Contains(msg, tc.want) {
			t.Errorf("kpr run %v said %q, want it to name the flag and %q", tc.flags, msg, tc.want)
		}
		if strings.Contains(msg, "kubeconfig") || strings.Contains(msg, "/nonexistent") {
			t.Errorf("kpr run %v got past the mode check: %q", tc.flags, msg)
		}
		// The error line (after kpr's start-up log line) may begin by
		// naming the refused flag; anywhere else it would be a suggestion.
		var errLine string
		for _, line := range strings.Split(msg, "\n") {
			if strings.HasPrefix(line, "kpr: ") {
				errLine = strings.TrimPrefix(line, "kpr: ")
			}
		}
		if errLine == "" {
			t.Errorf("kpr run %v printed no error line: %q", tc.flags, msg)
		}
		for _, refused := range []string{"--mode ipvs", "--fallback-mode ipvs"} {
			if !strings.HasPrefix(errLine, refused) && strings.Contains(errLine, refused) {
				t.Errorf("kpr run %v suggests %s, which it refuses too: %q", tc.flags, refused, msg)
			}
		}
	}
}
