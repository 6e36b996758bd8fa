package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/ipvs"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// virtualServersResult is the part of `kpr explain -o json` that the IPVS
// mode fills in.
type virtualServersResult struct {
	Dataplane      string `json:"dataplane"`
	VirtualServers []struct {
		Frontend string   `json:"frontend"`
		Have     []string `json:"have"`
		Matches  bool     `json:"matches"`
	} `json:"virtualServers"`
	MapsError   string   `json:"mapsError"`
	Divergences []string `json:"divergences"`
}

// TestExplainIPVS: in the IPVS mode, `kpr explain` reads the virtual
// servers back and shows each frontend's real servers, and `kpr status`
// counts kpr's virtual servers; a real server deleted by hand is named as
// a divergence. (It needs IPVS in the kernel: it runs in the
// kernel-matrix VM, make test-kernels-e2e.)
func TestExplainIPVS(t *testing.T) {
	forEachMode(t, []dataMode{modeIPVS}, func(t *testing.T, m dataMode) {
		// The periodic reconcile would repair IPVS before explain looks.
		f := newModeFixture(t, m, "--sync-period", "10m")
		ns := f.namespace(t, "explain-ipvs")
		svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
		f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
		vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
		podA := dataplane.Backend{Addr: f.pod("pod-a").IPv4, Port: tcpPort}
		podB := dataplane.Backend{Addr: f.pod("pod-b").IPv4, Port: tcpPort}
		want := []string{podA.String(), podB.String()}
		slices.Sort(want)

		explain := func() virtualServersResult {
			t.Helper()
			out := f.kprCommand(t, f.explainArgs(ns+"/web", "-o", "json")...)
			var r virtualServersResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("parse kpr explain output: %v\n%s", err, out)
			}
			return r
		}
		realServersOf := func(r virtualServersResult) []string {
			for _, vs := range r.VirtualServers {
				if vs.Frontend == vip.String()+"/TCP" {
					return vs.Have
				}
			}
			return nil
		}
		waitUntil(t, convergeTimeout, "kpr explain reads the Service's virtual server", func() error {
			r := explain()
			if r.Dataplane != "ipvs" || r.MapsError != "" || len(r.Divergences) > 0 || !slices.Equal(realServersOf(r), want) {
				return fmt.Errorf("%+v", r)
			}
			return nil
		})

		// kpr status counts the virtual servers where the eBPF mode shows
		// map fill.
		var st struct {
			Dataplane string `json:"dataplane"`
			IPVS      []struct {
				Table   string `json:"table"`
				Entries int    `json:"entries"`
			} `json:"ipvs"`
		}
		out, _ := f.kprStatus(t, f.statusArgs("-o", "json")...)
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatal(err)
		}
		if st.Dataplane != "ipvs" || len(st.IPVS) == 0 || st.IPVS[0].Table != "virtual servers" || st.IPVS[0].Entries == 0 {
			t.Errorf("kpr status in the IPVS mode: %+v; want kpr's virtual servers counted", st)
		}

		// By hand: pod-b's real server deleted, as ipvsadm -d could.
		k, err := ipvs.NewNetlinkKernel(f.node.NetNS.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		key := ipvs.ServiceKey{Addr: vip.Addr(), Proto: dataplane.TCP, Port: vip.Port()}
		if err := k.DelDest(key, podB); err != nil {
			t.Fatal(err)
		}
		r := explain()
		if !slices.ContainsFunc(r.Divergences, func(d string) bool {
			return strings.HasPrefix(d, vip.String()+"/TCP: virtual server ") && strings.Contains(d, "kpr wants "+fmt.Sprint(want))
		}) {
			t.Errorf("divergences %q: want the virtual server of %s without %s", r.Divergences, vip, podB)
		}
		if got := realServersOf(r); slices.Contains(got, podB.String()) {
			t.Errorf("explain shows %s sending to %v after %s was deleted", vip, got, podB)
		}
		table := string(f.kprCommand(t, f.explainArgs(ns+"/web")...))
		if !strings.Contains(table, "DIVERGENCE: "+vip.String()+"/TCP: virtual server") {
			t.Errorf("kpr explain table does not name the divergence:\n%s", table)
		}
		t.Logf("kpr explain %s/web:\n%s", ns, table)
	})
}
