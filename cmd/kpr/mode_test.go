package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/metrics"
)

// The features of a kernel that runs kpr's eBPF dataplane.
var socketLBFeatures = []string{loader.FeatureConnect, loader.FeatureSendmsg, loader.FeatureRecvmsg,
	loader.FeatureSocketCookie, loader.FeatureNetnsCookie, loader.FeatureLRUHash, loader.FeatureNoPrealloc,
	loader.FeatureCgroupLink}

// report builds a probe report that has every socket-LB feature except
// those in lacking, whose probes failed with probeErr.
func report(probeErr string, lacking ...string) loader.Report {
	r := loader.Report{Kernel: "5.4.0-test"}
	for _, name := range socketLBFeatures {
		f := loader.Feature{Name: name, Supported: true}
		for _, l := range lacking {
			if l == name {
				f = loader.Feature{Name: name, Error: probeErr}
			}
		}
		r.Features = append(r.Features, f)
	}
	return r
}

const noSuchAttach = "load program for attach type CGroupUDP4Recvmsg: invalid argument"

func TestChooseDataplane(t *testing.T) {
	full := report("")
	noRecvmsg := report(noSuchAttach, loader.FeatureRecvmsg)
	for _, tc := range []struct {
		name   string
		mode   string
		report loader.Report
		want   backend
		// wantErr are substrings of the error; none means success.
		wantErr []string
	}{
		{"auto on a capable kernel", "auto", full, backendEBPF, nil},
		{"ebpf on a capable kernel", "ebpf", full, backendEBPF, nil},
		{"auto without recvmsg hooks", "auto", noRecvmsg, "",
			[]string{"--mode auto", loader.FeatureRecvmsg, "5.4.0-test", "kube-proxy"}},
		{"ebpf without recvmsg and link", "ebpf", report(noSuchAttach, loader.FeatureRecvmsg, loader.FeatureCgroupLink), "",
			[]string{"--mode ebpf", loader.FeatureRecvmsg, loader.FeatureCgroupLink, "Linux 5.8"}},
		{"auto without the privilege to probe", "auto",
			report("load program: operation not permitted", loader.FeatureConnect, loader.FeatureLRUHash), "",
			[]string{"not permit", loader.FeatureConnect, loader.FeatureLRUHash, "CAP_BPF"}},
		{"auto on an empty report", "auto", loader.Report{Kernel: "5.4.0-test"}, "",
			[]string{loader.FeatureConnect, loader.FeatureCgroupLink}},
		{"iptables on a capable kernel", "iptables", full, backendIPTables, nil},
		{"iptables on a kernel without hooks", "iptables", noRecvmsg, backendIPTables, nil},
		{"iptables on an empty report", "iptables", loader.Report{Kernel: "5.4.0-test"}, backendIPTables, nil},
		{"auto without hooks names the iptables mode", "auto", noRecvmsg, "", []string{"--mode auto", "--mode iptables"}},
		{"ebpf without hooks names the iptables mode", "ebpf", noRecvmsg, "", []string{"--mode ebpf", "--mode iptables"}},
		{"ipvs on a kernel without hooks", "ipvs", noRecvmsg, "", []string{"--mode ipvs", "no IPVS dataplane", "--mode iptables"}},
		{"unknown", "nftables", full, "", []string{`"nftables"`, "auto, ebpf or iptables"}},
		{"empty", "", full, "", []string{`--mode ""`, "auto, ebpf or iptables"}},
		{"case matters, as in kube-proxy", "eBPF", full, "", []string{"auto, ebpf or iptables"}},
		{"case matters for iptables too", "IPTables", full, "", []string{"auto, ebpf or iptables"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := chooseDataplane(tc.mode, tc.report)
			if tc.wantErr == nil {
				if err != nil || c.backend != tc.want || c.reason == "" {
					t.Fatalf("chooseDataplane(%q) = %+v, %v; want %s with a reason", tc.mode, c, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("chooseDataplane(%q) = %+v, want an error", tc.mode, c)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
			// kpr must not send users to a mode it refuses.
			for _, refused := range []string{"--mode ipvs"} {
				if tc.mode != refused[len("--mode "):] && strings.Contains(err.Error(), refused) {
					t.Errorf("error %q suggests %s, which this build refuses", err, refused)
				}
			}
			if tc.report.Has(loader.FeatureConnect) && strings.Contains(err.Error(), "permit") {
				t.Errorf("error %q blames privileges for features that are missing", err)
			}
		})
	}
}

func TestProbeSaysWhatAutoRuns(t *testing.T) {
	if got := autoModeOf(report("")); got.Backend != "ebpf" || got.Error != "" {
		t.Errorf("auto mode on a capable kernel = %+v, want ebpf", got)
	}
	got := autoModeOf(report(noSuchAttach, loader.FeatureRecvmsg))
	if got.Backend != "" || !strings.Contains(got.Error, loader.FeatureRecvmsg) {
		t.Errorf("auto mode without recvmsg hooks = %+v, want an error naming them", got)
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
