package main

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kpr-io/kpr/iptables-compat/ipvs"
)

// parseRun parses args as kpr's command line, as main does (kube-proxy's
// command line names no subcommand), and resolves the settings `kpr run`
// would start with, without starting it.
func parseRun(t *testing.T, args ...string) (*runFlags, *globalFlags, ignoredSettings, error) {
	t.Helper()
	g, f := &globalFlags{}, &runFlags{}
	root := newRootCommandFor(g, f)
	var ignored ignoredSettings
	var resolveErr error
	ran := false
	for _, c := range root.Commands() {
		if c.Name() == "run" {
			c.RunE = func(cmd *cobra.Command, _ []string) error {
				ran = true
				ignored, resolveErr = resolveSettings(f, g, cmd.Flags())
				return resolveErr
			}
		}
	}
	root.SetArgs(kubeProxyArgs(args, root))
	err := root.Execute()
	if err == nil && !ran {
		t.Fatalf("kpr %v did not reach `kpr run`", args)
	}
	return f, g, ignored, err
}

func TestKubeadmDefaultConfigMapsWithoutWarnings(t *testing.T) {
	// kubeadm's DaemonSet command line, with $(NODE_NAME) expanded.
	f, g, ignored, err := parseRun(t, "--config=testdata/kubeadm-default.conf", "--hostname-override=worker-1")
	if err != nil {
		t.Fatal(err)
	}
	if f.kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || f.clusterCIDR != "10.244.0.0/16" || f.hostnameOverride != "worker-1" {
		t.Errorf("kubeconfig %q, clusterCIDR %q, hostname %q: the file's settings and the flag were not applied", f.kubeconfig, f.clusterCIDR, f.hostnameOverride)
	}
	// Every other field is zero, which leaves kpr's defaults.
	if f.mode != "auto" || f.syncPeriod != 30*time.Second || f.healthzAddr != "0.0.0.0:10256" || f.metricsAddr != "127.0.0.1:10249" || g.logLevel != "info" {
		t.Errorf("zero fields changed kpr's defaults: mode %q sync %s healthz %q metrics %q log %q", f.mode, f.syncPeriod, f.healthzAddr, f.metricsAddr, g.logLevel)
	}
	if !ignored.empty() {
		t.Errorf("kubeadm's unchanged file draws a warning: %+v", ignored)
	}
}

func TestKubeProxyConfigProtections(t *testing.T) {
	f, _, ignored, err := parseRun(t, "--config=testdata/protections.conf")
	if err != nil {
		t.Fatal(err)
	}
	if f.localhostNodePorts() || f.kubeProxy.localhostNodePorts {
		t.Error("iptables.localhostNodePorts: false left localhost NodePorts on")
	}
	if !f.ipvs.strictARP {
		t.Error("ipvs.strictARP: true was not applied")
	}
	if !ignored.empty() {
		t.Errorf("settings reported as unused: %+v", ignored)
	}
	// No NodePort on loopback in any mode: the watcher's selection too.
	cfg, err := f.watcherConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.NodePortAddresses.Select(nil) {
		t.Errorf("localhostNodePorts: false still serves NodePorts on %s", a)
	}
	// Beside --config the file wins and the flag is named, as in kube-proxy.
	f, _, ignored, err = parseRun(t, "--config=testdata/protections.conf", "--iptables-localhost-nodeports=true")
	if err != nil || f.localhostNodePorts() {
		t.Errorf("--iptables-localhost-nodeports=true beside the file's false: localhost NodePorts %v, %v", f.localhostNodePorts(), err)
	}
	if !reflect.DeepEqual(ignored.underConfig, []string{"--iptables-localhost-nodeports=true"}) {
		t.Errorf("flags overridden by the file = %q, want the one given", ignored.underConfig)
	}
}

func TestTunedKubeProxyConfigMapsEveryFieldAndWarnsOnce(t *testing.T) {
	f, g, ignored, err := parseRun(t, "--config", "testdata/kubeadm-tuned.conf")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]any{
		"mode": f.mode, "fallback": f.fallbackMode, "clusterCIDR": f.clusterCIDR, "nodePortAddresses": f.nodePortAddresses,
		"syncPeriod": f.syncPeriod, "minSyncPeriod": f.minSyncPeriod,
		"healthz": f.healthzAddr, "metrics": f.metricsAddr, "profiling": f.profiling,
		"hostname": f.hostnameOverride, "kubeconfig": f.kubeconfig,
		"qps": f.kubeProxy.qps, "burst": f.kubeProxy.burst, "contentType": f.kubeProxy.contentType,
		"logLevel": g.logLevel, "logFormat": g.logFormat, "masqueradeAll": f.kubeProxy.masqueradeAll,
		"ipvsScheduler": f.ipvs.scheduler, "ipvsExclude": f.ipvs.excludeCIDRs,
		"conntrackMaxPerCore": f.conntrack.maxPerCore, "conntrackEstablished": f.conntrack.tcpEstablished, "conntrackCloseWait": f.conntrack.tcpCloseWait,
	}
	want := map[string]any{
		"mode": "auto", "fallback": "iptables", "clusterCIDR": "10.244.0.0/16,fd00:244::/56", "nodePortAddresses": []string{"primary"},
		"syncPeriod": 45 * time.Second, "minSyncPeriod": 2 * time.Second,
		"healthz": "0.0.0.0:10266", "metrics": "127.0.0.1:10259", "profiling": true,
		"hostname": "Node-7", "kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf",
		"qps": float32(20), "burst": int32(40), "contentType": "application/json",
		"logLevel": "4", "logFormat": "text", "masqueradeAll": true,
		"ipvsScheduler": "rr", "ipvsExclude": []string{"10.96.100.0/24"},
		"conntrackMaxPerCore": int32(65536), "conntrackEstablished": 24 * time.Hour, "conntrackCloseWait": time.Hour,
	}
	for k, w := range want {
		if !reflect.DeepEqual(got[k], w) {
			t.Errorf("%s = %#v, want %#v", k, got[k], w)
		}
	}
	wantUnsupported := []string{
		`featureGates.SomeGate=true`, `iptables.masqueradeBit=14`,
		`ipvs.syncPeriod="1m0s"`, `oomScoreAdj=-999`,
	}
	if !reflect.DeepEqual(ignored.unsupported, wantUnsupported) {
		t.Errorf("unsupported fields:\n got %q\nwant %q", ignored.unsupported, wantUnsupported)
	}
	if len(ignored.unknown) != 1 || !strings.Contains(ignored.unknown[0], "udpIdleTimeout") {
		t.Errorf("unknown fields = %q, want udpIdleTimeout reported", ignored.unknown)
	}
}

// TestConfigFileBeatsKubeProxyFlags: with --config, kube-proxy takes the
// file's values and ignores the flags that also set them, except
// --hostname-override, --master and the logging flags. kpr's own flags
// (those kube-proxy does not have) still win.
func TestConfigFileBeatsKubeProxyFlags(t *testing.T) {
	f, g, ignored, err := parseRun(t, "--config=testdata/kubeadm-tuned.conf",
		"--hostname-override=worker-2", "--master=https://10.0.0.1:6443", "--v=5",
		"--proxy-mode=ebpf", "--iptables-sync-period=10s", "--healthz-bind-address=127.0.0.1:1",
		"--kubeconfig=/etc/kpr/kubeconfig", "--kube-api-qps=7", "--nodeport-addresses=10.0.0.0/8",
		"--min-sync-period=1s", "--log-format=json")
	if err != nil {
		t.Fatal(err)
	}
	// The flags kube-proxy applies over the file, and kpr's own.
	if f.hostnameOverride != "worker-2" || f.kubeProxy.master != "https://10.0.0.1:6443" || f.minSyncPeriod != time.Second || g.logFormat != "json" {
		t.Errorf("hostname %q master %q min-sync %v log format %q: a flag that beats the file lost to it",
			f.hostnameOverride, f.kubeProxy.master, f.minSyncPeriod, g.logFormat)
	}
	// The file's values, where kube-proxy ignores the flags.
	if f.mode != "auto" || f.fallbackMode != "iptables" || f.syncPeriod != 45*time.Second || f.healthzAddr != "0.0.0.0:10266" ||
		f.kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || f.kubeProxy.qps != 20 ||
		!reflect.DeepEqual(f.nodePortAddresses, []string{"primary"}) || f.metricsAddr != "127.0.0.1:10259" {
		t.Errorf("a kube-proxy flag beat the file: mode %q sync %v healthz %q kubeconfig %q qps %v nodeports %q metrics %q",
			f.mode, f.syncPeriod, f.healthzAddr, f.kubeconfig, f.kubeProxy.qps, f.nodePortAddresses, f.metricsAddr)
	}
	want := []string{"--healthz-bind-address=127.0.0.1:1", "--iptables-sync-period=10s", "--kube-api-qps=7",
		"--kubeconfig=/etc/kpr/kubeconfig", "--nodeport-addresses=[10.0.0.0/8]", "--proxy-mode=ebpf"}
	if !reflect.DeepEqual(ignored.underConfig, want) {
		t.Errorf("flags named as overridden by the file:\n got %q\nwant %q", ignored.underConfig, want)
	}
	if len(ignored.unsupported) == 0 {
		t.Error("the file's unsupported fields went unreported")
	}
}

func TestKubeProxyCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		check   func(*runFlags, *globalFlags) bool
		flags   []string // the ignored flags' warning names these
		wantErr string
	}{
		{name: "proxy-mode names the fallback", args: []string{"--proxy-mode=nftables"},
			check: func(f *runFlags, _ *globalFlags) bool {
				return f.mode == "auto" && f.fallbackMode == "nftables" && strings.Contains(f.kubeProxy.modeNote, "names kpr's fallback")
			}},
		{name: "kpr's mode and fallback win", args: []string{"run", "--mode=ebpf", "--fallback-mode=iptables", "--proxy-mode=ipvs"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.mode == "ebpf" && f.fallbackMode == "iptables" }},
		{name: "proxy-mode ebpf is the mode", args: []string{"--proxy-mode=ebpf"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.mode == "ebpf" }},
		{name: "mode and proxy-mode disagree", args: []string{"run", "--mode=iptables", "--proxy-mode=ebpf"}, wantErr: "disagree"},
		{name: "-v 4 is verbosity 4", args: []string{"-v", "4"},
			check: func(_ *runFlags, g *globalFlags) bool { return g.logLevel == "4" }},
		{name: "--v=2 is verbosity 2", args: []string{"--v=2"},
			check: func(_ *runFlags, g *globalFlags) bool { return g.logLevel == "2" }},
		{name: "--logging-format is --log-format", args: []string{"--logging-format=text"},
			check: func(_ *runFlags, g *globalFlags) bool { return g.logFormat == "text" }},
		{name: "--log-level beats -v", args: []string{"--v=5", "--log-level=error"},
			check: func(_ *runFlags, g *globalFlags) bool { return g.logLevel == "error" }},
		{name: "master and API rate", args: []string{"--master=https://10.0.0.1:6443", "--kube-api-qps=50", "--kube-api-burst=100", "--kube-api-content-type=application/json"},
			check: func(f *runFlags, _ *globalFlags) bool {
				return f.kubeProxy.master == "https://10.0.0.1:6443" && f.kubeProxy.qps == 50 && f.kubeProxy.burst == 100 && f.kubeProxy.contentType == "application/json"
			}},
		{name: "k8s-api-server is master", args: []string{"run", "--k8s-api-server=10.0.0.1:6443"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.kubeProxy.master == "10.0.0.1:6443" }},
		{name: "ipvs periods with ipvs mode", args: []string{"--proxy-mode=ipvs", "--ipvs-sync-period=5s", "--ipvs-min-sync-period=1s", "--iptables-sync-period=9s"},
			check: func(f *runFlags, _ *globalFlags) bool {
				return f.syncPeriod == 5*time.Second && f.minSyncPeriod == time.Second
			},
			flags: []string{"--iptables-sync-period"}},
		{name: "unspecified bind address means nothing", args: []string{"--bind-address=0.0.0.0"},
			check: func(*runFlags, *globalFlags) bool { return true }},
		{name: "specific bind address is warned about", args: []string{"--bind-address=10.1.2.3"},
			check: func(*runFlags, *globalFlags) bool { return true }, flags: []string{"--bind-address=10.1.2.3"}},
		{name: "bad bind address", args: []string{"--bind-address=node-1"}, wantErr: "--bind-address"},
		{name: "flags without meaning are accepted", args: []string{"--masquerade-all", "--feature-gates=A=true,B=false", "--oom-score-adj=-999", "--nodeport-addresses=primary"},
			check: func(f *runFlags, _ *globalFlags) bool {
				// --masquerade-all has a meaning now: the iptables mode's.
				return reflect.DeepEqual(f.nodePortAddresses, []string{"primary"}) && f.kubeProxy.masqueradeAll
			},
			flags: []string{"--feature-gates=A=true,B=false", "--oom-score-adj=-999"}},
		{name: "IPVS timeouts", args: []string{"--ipvs-tcp-timeout=15m", "--ipvs_udp_timeout=40s"},
			check: func(f *runFlags, _ *globalFlags) bool {
				return f.ipvs.timeouts == ipvs.Timeouts{TCP: 15 * time.Minute, UDP: 40 * time.Second}
			}},
		{name: "conntrack flags are kube-proxy's", args: []string{"--conntrack-max-per-core=0", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=45s"},
			check: func(f *runFlags, _ *globalFlags) bool {
				s := f.conntrack.sysctls()
				return s.MaxPerCore == 0 && s.Min == 131072 && s.TCPBeLiberal && s.UDP == 45*time.Second && s.TCPEstablished == 24*time.Hour &&
					s.TCPCloseWait == time.Hour && f.conntrack.tcTimeouts().UDP == 45*time.Second
			}},
		{name: "ipvs-strict-arp is applied", args: []string{"--proxy-mode=ipvs", "--ipvs-strict-arp"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.ipvs.strictARP }},
		{name: "localhost NodePorts by default", args: []string{"--proxy-mode=iptables"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.localhostNodePorts() }},
		{name: "iptables-localhost-nodeports=false is applied", args: []string{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false"},
			check: func(f *runFlags, _ *globalFlags) bool { return !f.localhostNodePorts() }},
		{name: "no localhost NodePorts where nodeport-addresses leave out loopback", args: []string{"--proxy-mode=iptables", "--nodeport-addresses=10.0.0.0/8"},
			check: func(f *runFlags, _ *globalFlags) bool { return !f.localhostNodePorts() }},
		{name: "localhost NodePorts where nodeport-addresses name localhost", args: []string{"--proxy-mode=iptables", "--nodeport-addresses=primary,localhost"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.localhostNodePorts() }},
		{name: "cleanup and init-only are kube-proxy's jobs", args: []string{"--cleanup", "--init-only"},
			check: func(f *runFlags, _ *globalFlags) bool { return f.kubeProxy.cleanup && f.kubeProxy.initOnly }},
		{name: "write-config-to is refused", args: []string{"--write-config-to=/tmp/x"}, wantErr: "one-off"},
		{name: "not a kube-proxy file", args: []string{"--config=testdata/not-kube-proxy.yaml"}, wantErr: "KubeProxyConfiguration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, g, ignored, err := parseRun(t, tc.args...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f, g) {
				t.Errorf("settings not as the flags say: %+v", f)
			}
			if len(ignored.flags) != len(tc.flags) {
				t.Errorf("ignored flags %q, want %q", ignored.flags, tc.flags)
			}
			for _, want := range tc.flags {
				found := false
				for _, got := range ignored.flags {
					found = found || strings.HasPrefix(got, want)
				}
				if !found {
					t.Errorf("ignored flags %q do not name %s", ignored.flags, want)
				}
			}
		})
	}
}

func TestKubeProxyArgsInsertRunOnlyWithoutSubcommand(t *testing.T) {
	root := newRootCommand()
	for _, tc := range []struct{ in, want []string }{
		{[]string{"--config=/c", "--hostname-override=n"}, []string{"run", "--config=/c", "--hostname-override=n"}},
		{[]string{"--config", "/c"}, []string{"run", "--config", "/c"}},
		{[]string{"--version"}, []string{"run", "--version"}},
		{[]string{"--log-level", "debug", "dump"}, []string{"--log-level", "debug", "dump"}},
		{[]string{"run", "--config=/c"}, []string{"run", "--config=/c"}},
		{[]string{"--help"}, []string{"--help"}},
		{[]string{"help"}, []string{"help"}},
		{nil, nil},
	} {
		if got := kubeProxyArgs(tc.in, root); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("kubeProxyArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestVersionNamesTheStampAndTheCommit(t *testing.T) {
	old := version
	version = "v1.2.3"
	defer func() { version = old }()
	if s := versionString(); !strings.HasPrefix(s, "kpr v1.2.3") {
		t.Errorf("versionString() = %q, want the stamped version", s)
	}
	if got := vcsSuffix(nil); got != "" {
		t.Errorf("vcsSuffix(no VCS info) = %q", got)
	}
}

// TestVersionFlagAsKubeProxy: --version, --version=raw and
// --version=false, in kube-proxy's spelling (no run subcommand).
func TestVersionFlagAsKubeProxy(t *testing.T) {
	for _, tc := range []struct {
		arg, want string
	}{
		{"--version", "kpr dev"},
		{"--version=true", "kpr dev"},
		{"--version=raw", `version.Info{Version:"dev", GitCommit:`},
	} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(kubeProxyArgs([]string{tc.arg}, root))
		if err := root.Execute(); err != nil || !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("kpr %s printed %q (%v), want it to start %q", tc.arg, out.String(), err, tc.want)
		}
	}
	if _, _, _, err := parseRun(t, "--version=maybe"); err == nil || !strings.Contains(err.Error(), "want true, false or raw") {
		t.Errorf("--version=maybe: err %v, want it refused", err)
	}
}

// TestUnderscoresSpellDashes: kube-proxy normalizes _ to - in flag names.
func TestUnderscoresSpellDashes(t *testing.T) {
	f, _, _, err := parseRun(t, "--proxy_mode=ipvs", "--ipvs_sync_period=5s", "--hostname_override=node-9")
	if err != nil || f.mode != "auto" || f.fallbackMode != "ipvs" || f.syncPeriod != 5*time.Second || f.hostnameOverride != "node-9" {
		t.Errorf("--proxy_mode, --ipvs_sync_period, --hostname_override: mode %q sync %v host %q (%v)", f.mode, f.syncPeriod, f.hostnameOverride, err)
	}
}

func TestWithDefaultPort(t *testing.T) {
	for in, want := range map[string]string{"": "", "0.0.0.0": "0.0.0.0:10256", "::": "[::]:10256", "[::1]:1": "[::1]:1", "1.2.3.4:5": "1.2.3.4:5"} {
		if got := withDefaultPort(in, "10256"); got != want {
			t.Errorf("withDefaultPort(%q) = %q, want %q", in, got, want)
		}
	}
}

// --cluster-cidr takes one CIDR per family, as kube-proxy's local-traffic
// detector does; the iptables mode masquerades from outside them.
func TestClusterCIDRs(t *testing.T) {
	f := &runFlags{clusterCIDR: "10.244.0.0/16, fd00:244::/56"}
	got, err := f.clusterCIDRs()
	if err != nil || len(got) != 2 || got[0].String() != "10.244.0.0/16" || got[1].String() != "fd00:244::/56" {
		t.Errorf("clusterCIDRs = %v, %v", got, err)
	}
	for _, bad := range []string{"10.244.0.0/16,10.245.0.0/16", "10.244.0.0"} {
		f := &runFlags{clusterCIDR: bad}
		if _, err := f.clusterCIDRs(); err == nil || !strings.Contains(err.Error(), "--cluster-cidr") {
			t.Errorf("--cluster-cidr %s: err %v, want one naming the flag", bad, err)
		}
	}
}

// TestConntrackSectionNullAndZero: null keeps kube-proxy's defaults, and an
// explicit 0 leaves the node's sysctl, as in kube-proxy.
func TestConntrackSectionNullAndZero(t *testing.T) {
	dir := t.TempDir()
	write := func(name, conntrack string) string {
		p := dir + "/" + name
		body := "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack:\n" + conntrack
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f, _, _, err := parseRun(t, "--config="+write("null.conf", "  maxPerCore: null\n  min: null\n  tcpEstablishedTimeout: null\n  tcpCloseWaitTimeout: null\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := f.conntrack.sysctls(); s.MaxPerCore != 32768 || s.Min != 131072 || s.TCPEstablished != 24*time.Hour || s.TCPCloseWait != time.Hour {
		t.Errorf("null fields: %+v, want kube-proxy's defaults", s)
	}
	f, _, ignored, err := parseRun(t, "--config="+write("zero.conf", "  maxPerCore: 0\n  tcpEstablishedTimeout: 0s\n  udpTimeout: 40s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s := f.conntrack.sysctls(); s.MaxPerCore != 0 || s.TCPEstablished != 0 || s.UDP != 40*time.Second || s.TCPCloseWait != time.Hour {
		t.Errorf("zero fields: %+v, want maxPerCore and tcpEstablishedTimeout 0 (leave the sysctls), udpTimeout 40s", s)
	}
	if len(ignored.unsupported) != 0 {
		t.Errorf("conntrack fields named as unsupported: %q", ignored.unsupported)
	}
}
