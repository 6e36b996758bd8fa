package main

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/iptables-compat/nftables"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// The features of a kernel that runs kpr's eBPF dataplane.
var socketLBFeatures = []string{loader.FeatureConnect, loader.FeatureSendmsg, loader.FeatureRecvmsg,
	loader.FeatureSocketCookie, loader.FeatureNetnsCookie, loader.FeatureLRUHash, loader.FeatureNoPrealloc,
	loader.FeatureCgroupLink}

// optionalFeatures are probed too, but the eBPF dataplane runs without
// them (degraded): they must never decide the mode.
var optionalFeatures = []string{loader.FeatureGetpeername, loader.FeatureSockRelease, loader.FeatureSetRetval,
	loader.FeatureBatchOps, loader.FeatureUDPSockTerm, loader.FeatureNetnsCookieSockopt}

// report builds a probe report that has every feature except those in
// lacking, whose probes failed with probeErr. IPVS is a feature too.
func report(probeErr string, lacking ...string) loader.Report {
	r := loader.Report{Kernel: "5.4.0-test"}
	for _, name := range append(append([]string{netfilter.IPVSFeature, nftables.Feature}, socketLBFeatures...), optionalFeatures...) {
		f := loader.Feature{Name: name, Supported: true}
		if slices.Contains(lacking, name) {
			f = loader.Feature{Name: name, Error: probeErr}
		}
		r.Features = append(r.Features, f)
	}
	return r
}

const noSuchAttach = "load program for attach type CGroupUDP4Recvmsg: invalid argument"

// checkErr fails unless err contains every want, and checks what every
// refusal must not do.
func checkErr(t *testing.T, err error, mode string, rep loader.Report, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("mode %q: no error, want one containing %q", mode, want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	// kpr must not send users to the mode that has just been refused.
	if prefix, _, _ := strings.Cut(err.Error(), ":"); strings.Count(err.Error(), prefix) > 1 {
		t.Errorf("error %q suggests %s, the very mode it refuses", err, prefix)
	}
	if rep.Has(loader.FeatureConnect) && strings.Contains(err.Error(), "permit") {
		t.Errorf("error %q blames privileges for features that are missing", err)
	}
}

// TestChooseDataplaneEveryMissingFeature: every combination of missing
// required features, with and without the optional ones, decides the
// same way: auto falls back naming each missing feature, ebpf refuses
// naming each, iptables runs regardless.
func TestChooseDataplaneEveryMissingFeature(t *testing.T) {
	n := len(socketLBFeatures)
	for mask := 0; mask < 1<<n; mask++ {
		var missing []string
		for i, name := range socketLBFeatures {
			if mask&(1<<i) != 0 {
				missing = append(missing, name)
			}
		}
		for _, optional := range [][]string{nil, optionalFeatures} {
			rep := report(noSuchAttach, append(append([]string{}, missing...), optional...)...)
			auto, err := chooseDataplane(modeAuto, "iptables", rep)
			if err != nil {
				t.Fatalf("auto without %v: %v, want a choice", missing, err)
			}
			ebpf, ebpfErr := chooseDataplane("ebpf", "iptables", rep)
			if len(missing) == 0 {
				if auto.backend != backendEBPF || auto.cause != causeEBPFSupported || ebpfErr != nil || ebpf.backend != backendEBPF {
					t.Errorf("capable kernel (optional missing %v): auto = %+v, ebpf = %+v, %v; want ebpf", optional, auto, ebpf, ebpfErr)
				}
			} else {
				if auto.backend != backendIPTables || auto.cause != causeEBPFUnavailable {
					t.Errorf("auto without %v = %+v, want the iptables fallback", missing, auto)
				}
				for _, name := range missing {
					if !strings.Contains(auto.reason, name) {
						t.Errorf("auto without %v: reason %q does not name %s", missing, auto.reason, name)
					}
				}
				checkErr(t, ebpfErr, "ebpf", rep, append([]string{"--mode ebpf", "5.4.0-test", "--mode iptables"}, missing...)...)
			}
			for _, name := range optional {
				if ebpfErr != nil && strings.Contains(ebpfErr.Error(), name) {
					t.Errorf("ebpf error %q names optional feature %s", ebpfErr, name)
				}
			}
			if c, err := chooseDataplane("iptables", "iptables", rep); err != nil || c.backend != backendIPTables || c.cause != causeRequested {
				t.Errorf("iptables without %v = %+v, %v; want iptables, requested", missing, c, err)
			}
		}
	}
}

func TestChooseDataplane(t *testing.T) {
	full := report("")
	noRecvmsg := report(noSuchAttach, loader.FeatureRecvmsg)
	denied := report("load program: operation not permitted", socketLBFeatures...)
	const noIPVSErr = "no IPVS generic netlink family and no /proc/net/ip_vs: load the ip_vs module (modprobe ip_vs)"
	noIPVS := report(noIPVSErr, netfilter.IPVSFeature)
	noRecvmsgNoIPVS := report(noIPVSErr, loader.FeatureRecvmsg, netfilter.IPVSFeature)
	for _, tc := range []struct {
		name      string
		mode      string
		fallback  string
		report    loader.Report
		want      backend
		wantCause string
		// want are substrings of the reason, or of the error if wantErr.
		want2   []string
		wantErr bool
	}{
		{"auto on a capable kernel", "auto", "iptables", full, backendEBPF, causeEBPFSupported, nil, false},
		{"ebpf on a capable kernel", "ebpf", "iptables", full, backendEBPF, causeRequested, nil, false},
		{"auto without recvmsg hooks falls back", "auto", "iptables", noRecvmsg, backendIPTables, causeEBPFUnavailable,
			[]string{"--fallback-mode iptables", loader.FeatureRecvmsg, "5.4.0-test"}, false},
		{"auto where BPF is forbidden falls back, naming the privileges", "auto", "iptables", denied, backendIPTables, causeEBPFUnavailable,
			[]string{"not permit", "CAP_BPF", loader.FeatureConnect}, false},
		{"auto on an empty report falls back", "auto", "iptables", loader.Report{Kernel: "5.4.0-test"}, backendIPTables, causeEBPFUnavailable,
			[]string{loader.FeatureConnect, loader.FeatureCgroupLink}, false},
		{"ebpf without recvmsg and link", "ebpf", "iptables", report(noSuchAttach, loader.FeatureRecvmsg, loader.FeatureCgroupLink), "", "",
			[]string{"--mode ebpf", loader.FeatureRecvmsg, loader.FeatureCgroupLink, "Linux 5.8", "--mode iptables"}, true},
		{"ebpf without the privilege to probe", "ebpf", "iptables", denied, "", "",
			[]string{"--mode ebpf", "not permit", "CAP_BPF"}, true},
		{"iptables on a capable kernel", "iptables", "iptables", full, backendIPTables, causeRequested, nil, false},
		{"iptables on an empty report", "iptables", "iptables", loader.Report{Kernel: "5.4.0-test"}, backendIPTables, causeRequested, nil, false},
		{"ipvs on a kernel with IPVS, without the eBPF hooks", "ipvs", "iptables", noRecvmsg, backendIPVS, causeRequested, []string{"--mode ipvs"}, false},
		{"ipvs on a kernel without IPVS", "ipvs", "iptables", noIPVS, "", "",
			[]string{"--mode ipvs", "no IPVS", "modprobe ip_vs", "5.4.0-test", "--mode iptables"}, true},
		{"auto falls back to ipvs", "auto", "ipvs", noRecvmsg, backendIPVS, causeEBPFUnavailable,
			[]string{"--fallback-mode ipvs", loader.FeatureRecvmsg}, false},
		{"auto does not fall back to ipvs without IPVS", "auto", "ipvs", noRecvmsgNoIPVS, "", "",
			[]string{"--mode auto", loader.FeatureRecvmsg, "--fallback-mode ipvs", "no IPVS", "--fallback-mode iptables"}, true},
		{"auto with an ipvs fallback needs no IPVS where eBPF runs", "auto", "ipvs", noIPVS, backendEBPF, causeEBPFSupported, nil, false},
		{"an ipvs fallback is accepted under --mode iptables", "iptables", "ipvs", full, backendIPTables, causeRequested, nil, false},
		{"fallback ebpf is no fallback", "auto", "ebpf", noRecvmsg, "", "", []string{`--fallback-mode "ebpf"`, "want auto, iptables, ipvs or nftables"}, true},
		{"empty fallback", "auto", "", full, "", "", []string{`--fallback-mode ""`}, true},
		{"unknown", "userspace", "iptables", full, "", "", []string{`"userspace"`, "auto, ebpf, iptables, ipvs or nftables"}, true},
		{"nftables on a kernel that runs it, without the eBPF hooks", "nftables", "iptables", noRecvmsg, backendNFTables, causeRequested, []string{"--mode nftables"}, false},
		{"nftables on a kernel older than 5.13", "nftables", "iptables", report("kernel 5.4.0-test is older than 5.13", nftables.Feature), "", "",
			[]string{"--mode nftables", "older than 5.13", "--mode iptables"}, true},
		{"auto with the automatic fallback runs nftables where the kernel does", "auto", "auto", noRecvmsg, backendNFTables, causeEBPFUnavailable,
			[]string{"runs nftables", loader.FeatureRecvmsg}, false},
		{"auto with the automatic fallback runs iptables on a kernel older than 5.13", "auto", "auto",
			report("kernel 5.4.0-test is older than 5.13", loader.FeatureRecvmsg, nftables.Feature), backendIPTables, causeEBPFUnavailable,
			[]string{"runs iptables", "older than 5.13", loader.FeatureRecvmsg}, false},
		{"auto with the automatic fallback runs eBPF where it can", "auto", "auto", full, backendEBPF, causeEBPFSupported, nil, false},
		{"auto falls back to nftables", "auto", "nftables", noRecvmsg, backendNFTables, causeEBPFUnavailable,
			[]string{"--fallback-mode nftables", loader.FeatureRecvmsg}, false},
		{"empty", "", "iptables", full, "", "", []string{`--mode ""`, "auto, ebpf, iptables, ipvs or nftables"}, true},
		{"case matters, as in kube-proxy", "eBPF", "iptables", full, "", "", []string{"auto, ebpf, iptables, ipvs or nftables"}, true},
		{"case matters for iptables too", "IPTables", "iptables", full, "", "", []string{"auto, ebpf, iptables, ipvs or nftables"}, true},
		{"case matters for ipvs too", "IPVS", "iptables", full, "", "", []string{"auto, ebpf, iptables, ipvs or nftables"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := chooseDataplane(tc.mode, tc.fallback, tc.report)
			if tc.wantErr {
				checkErr(t, err, tc.mode, tc.report, tc.want2...)
				return
			}
			if err != nil || c.backend != tc.want || c.cause != tc.wantCause || c.reason == "" {
				t.Fatalf("chooseDataplane(%q, %q) = %+v, %v; want %s (%s) with a reason", tc.mode, tc.fallback, c, err, tc.want, tc.wantCause)
			}
			for _, w := range tc.want2 {
				if !strings.Contains(c.reason, w) {
					t.Errorf("reason %q lacks %q", c.reason, w)
				}
			}
		})
	}
}

func TestProbeSaysWhatAutoRuns(t *testing.T) {
	if got := autoModeOf(report(""), "iptables"); got.Backend != "ebpf" || got.Error != "" {
		t.Errorf("auto mode on a capable kernel = %+v, want ebpf", got)
	}
	got := autoModeOf(report(noSuchAttach, loader.FeatureRecvmsg), "iptables")
	if got.Backend != "iptables" || got.Cause != causeEBPFUnavailable || !strings.Contains(got.Reason, loader.FeatureRecvmsg) {
		t.Errorf("auto mode without recvmsg hooks = %+v, want the iptables fallback naming them", got)
	}
	got = autoModeOf(report(noSuchAttach, loader.FeatureRecvmsg), "ipvs")
	if got.Backend != "ipvs" || got.Cause != causeEBPFUnavailable {
		t.Errorf("auto mode with --fallback-mode ipvs without recvmsg hooks = %+v, want the ipvs fallback", got)
	}
	got = autoModeOf(report("no IPVS", loader.FeatureRecvmsg, netfilter.IPVSFeature), "ipvs")
	if got.Backend != "" || !strings.Contains(got.Error, "--fallback-mode ipvs") {
		t.Errorf("auto mode with --fallback-mode ipvs on a kernel without eBPF hooks and IPVS = %+v, want the refusal", got)
	}
}

func TestMetricNamesTheChosenModeAndWhy(t *testing.T) {
	m := metrics.New()
	exportChoice(m, choice{backend: backendIPTables, cause: causeEBPFUnavailable})
	rec := httptest.NewRecorder()
	m.Handler("iptables").ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if want := `kpr_proxy_mode{mode="iptables",reason="ebpf-unavailable"} 1`; !strings.Contains(rec.Body.String(), want) {
		t.Errorf("/metrics lacks %s", want)
	}
}

func TestProxyModeNamesTheChosenBackend(t *testing.T) {
	for _, profiling := range []bool{false, true} {
		h := metricsHandler(metrics.New(), choice{backend: "some-backend"}, profiling)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/proxyMode", nil))
		if rec.Code != http.StatusOK || rec.Body.String() != "some-backend" {
			t.Errorf("profiling %v: /proxyMode = %d %q, want the chosen backend's name", profiling, rec.Code, rec.Body.String())
		}
	}
}
