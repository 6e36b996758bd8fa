package netfilter

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kpr-io/kpr/netnsexec"
	"github.com/kpr-io/kpr/tests/namedns"
)

// kubeProxyDefaults are kube-proxy's defaults for its conntrack settings.
var kubeProxyDefaults = ConntrackSysctls{MaxPerCore: 32768, Min: 131072, TCPEstablished: 24 * time.Hour, TCPCloseWait: time.Hour}

func TestConntrackMaxAsKubeProxy(t *testing.T) {
	for _, tc := range []struct {
		s    ConntrackSysctls
		cpus int
		want int
	}{
		{kubeProxyDefaults, 2, 131072},   // the floor
		{kubeProxyDefaults, 8, 262144},   // scaled
		{kubeProxyDefaults, 64, 1 << 20}, // capped
		{ConntrackSysctls{Min: 131072}, 8, 0},
	} {
		if got := tc.s.Max(tc.cpus); got != tc.want {
			t.Errorf("%+v on %d CPUs: nf_conntrack_max %d, want %d", tc.s, tc.cpus, got, tc.want)
		}
	}
}

// fakeSysctls is a directory standing for /proc/sys/net/netfilter and the
// hash size parameter, with the given nf_conntrack_max mode.
func fakeSysctls(t *testing.T, maxMode os.FileMode) sysctlFS {
	t.Helper()
	dir := t.TempDir()
	fs := sysctlFS{netfilter: filepath.Join(dir, "netfilter"), hashsize: filepath.Join(dir, "hashsize")}
	if err := os.Mkdir(fs.netfilter, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{
		"nf_conntrack_max": "65536", "nf_conntrack_tcp_timeout_established": "432000", "nf_conntrack_tcp_timeout_close_wait": "60",
		"nf_conntrack_tcp_be_liberal": "0", "nf_conntrack_udp_timeout": "30", "nf_conntrack_udp_timeout_stream": "120",
	} {
		if err := os.WriteFile(filepath.Join(fs.netfilter, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(fs.hashsize, []byte("16384\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(fs.netfilter, "nf_conntrack_max"), maxMode); err != nil {
		t.Fatal(err)
	}
	return fs
}

func readFake(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestApplyWritesKubeProxysConntrackSettings(t *testing.T) {
	fs := fakeSysctls(t, 0o644)
	s := kubeProxyDefaults
	s.TCPBeLiberal, s.UDP, s.UDPStream = true, 45*time.Second, 3*time.Minute
	if err := s.apply(fs, 8, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"nf_conntrack_max": "262144", "nf_conntrack_tcp_timeout_established": "86400", "nf_conntrack_tcp_timeout_close_wait": "3600",
		"nf_conntrack_tcp_be_liberal": "1", "nf_conntrack_udp_timeout": "45", "nf_conntrack_udp_timeout_stream": "180",
	} {
		if got := readFake(t, filepath.Join(fs.netfilter, name)); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
	if got := readFake(t, fs.hashsize); got != "65536" {
		t.Errorf("hash size %s, want a quarter of nf_conntrack_max, 65536", got)
	}
}

func TestApplyLeavesWhatIsZeroOrMachineWide(t *testing.T) {
	// Zeros leave every sysctl as it is, as in kube-proxy.
	fs := fakeSysctls(t, 0o644)
	if err := (ConntrackSysctls{}).apply(fs, 8, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if readFake(t, filepath.Join(fs.netfilter, "nf_conntrack_max")) != "65536" || readFake(t, fs.hashsize) != "16384" ||
		readFake(t, filepath.Join(fs.netfilter, "nf_conntrack_tcp_timeout_established")) != "432000" {
		t.Error("zero settings changed a sysctl")
	}

	// Outside the node's namespace nf_conntrack_max is read-only: it and
	// the machine-wide hash size are left, with a warning, and the
	// per-namespace timeouts are still written.
	fs = fakeSysctls(t, 0o444)
	core, logs := observer.New(zap.WarnLevel)
	if err := kubeProxyDefaults.apply(fs, 8, zap.New(core)); err != nil {
		t.Fatal(err)
	}
	if readFake(t, fs.hashsize) != "16384" {
		t.Error("the hash size was raised although nf_conntrack_max could not be")
	}
	if logs.FilterMessageSnippet("cannot set nf_conntrack_max").Len() != 1 {
		t.Errorf("no warning that nf_conntrack_max was left: %v", logs.All())
	}
	if got := readFake(t, filepath.Join(fs.netfilter, "nf_conntrack_tcp_timeout_established")); got != "86400" {
		t.Errorf("established timeout %s, want 86400", got)
	}
}

// TestApplyInANetNS writes the settings into a network namespace of the
// test's own, where the kernel shows nf_conntrack_max read-only, and reads
// them back there; the node's own values stay as they were.
func TestApplyInANetNS(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("skipping: writes conntrack sysctls inside a network namespace of its own, which needs root")
	}
	const est = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
	if _, err := os.Stat(est); err != nil {
		t.Skipf("skipping: the node has no conntrack sysctls (nf_conntrack not loaded): %v", err)
	}
	nodeBefore := readFake(t, est)
	name := namedns.ForTest(t, "kpr-ctsys-")
	s := ConntrackSysctls{MaxPerCore: 1 << 30, TCPEstablished: 7 * time.Hour, TCPCloseWait: 90 * time.Second, TCPBeLiberal: true,
		UDP: 41 * time.Second, UDPStream: 171 * time.Second}
	core, logs := observer.New(zap.WarnLevel)
	var got map[string]string
	err := netnsexec.InPath("/run/netns/"+name, func() error {
		if err := s.Apply(zap.New(core)); err != nil {
			return err
		}
		got = map[string]string{}
		for _, n := range []string{"nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait", "nf_conntrack_tcp_be_liberal",
			"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"} {
			got[n] = readFake(t, "/proc/sys/net/netfilter/"+n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"nf_conntrack_tcp_timeout_established": strconv.Itoa(7 * 3600), "nf_conntrack_tcp_timeout_close_wait": "90",
		"nf_conntrack_tcp_be_liberal": "1", "nf_conntrack_udp_timeout": "41", "nf_conntrack_udp_timeout_stream": "171"}
	for n, w := range want {
		if got[n] != w {
			t.Errorf("%s = %q in the namespace, want %s", n, got[n], w)
		}
	}
	if logs.FilterMessageSnippet("cannot set nf_conntrack_max").Len() != 1 {
		t.Errorf("nf_conntrack_max is read-only in a namespace not the node's; want the warning, got %v", logs.All())
	}
	if after := readFake(t, est); after != nodeBefore {
		t.Errorf("the node's own established timeout changed: %s, was %s", after, nodeBefore)
	}
}
