package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kpr-io/kpr/tests/kubeobj"
)

// elementsResult is the part of `kpr explain -o json` that the nftables
// mode fills in.
type elementsResult struct {
	Dataplane string `json:"dataplane"`
	Elements  []struct {
		Frontend string            `json:"frontend"`
		Verdicts map[string]string `json:"verdicts"`
	} `json:"elements"`
	Divergences []string `json:"divergences"`
}

// TestExplainNFTables: in the nftables mode, `kpr explain` reads kpr's
// table back and shows each frontend's map elements; an element deleted
// by hand is named as a divergence, and `kpr status` counts the table's
// objects.
func TestExplainNFTables(t *testing.T) {
	forEachMode(t, []dataMode{modeNFTables}, func(t *testing.T, m dataMode) {
		// The periodic reconcile would repair the table before explain looks.
		f := newModeFixture(t, m, "--sync-period", "10m")
		ns := f.namespace(t, "explain-nftables")
		svc := f.createService(t, kubeobj.Service(ns, "web", tcp80))
		f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
		vip := clusterIP(t, svc, v1.IPv4Protocol, 80)

		explain := func() elementsResult {
			t.Helper()
			out := f.kprCommand(t, f.explainArgs(ns+"/web", "-o", "json")...)
			var r elementsResult
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("parse kpr explain output: %v\n%s", err, out)
			}
			return r
		}
		verdictOf := func(r elementsResult) string {
			for _, e := range r.Elements {
				if e.Frontend == vip.String()+"/TCP" {
					return e.Verdicts["service-ips-v4"]
				}
			}
			return ""
		}
		waitUntil(t, convergeTimeout, "kpr explain reads the Service's elements", func() error {
			r := explain()
			if r.Dataplane != "nftables" || len(r.Divergences) > 0 || !strings.HasPrefix(verdictOf(r), "goto service-") {
				return fmt.Errorf("%+v", r)
			}
			return nil
		})

		var st struct {
			Daemon *struct {
				Mode string `json:"mode"`
			} `json:"daemon"`
			NFTables []struct {
				Object string `json:"object"`
				Count  int    `json:"count"`
			} `json:"nftables"`
		}
		out, _ := f.kprStatus(t, f.statusArgs("-o", "json")...)
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatal(err)
		}
		if st.Daemon == nil || st.Daemon.Mode != "nftables" || !slices.ContainsFunc(st.NFTables, func(r struct {
			Object string `json:"object"`
			Count  int    `json:"count"`
		}) bool {
			return r.Object == "map service-ips-v4" && r.Count > 0
		}) {
			t.Errorf("kpr status in the nftables mode: daemon %+v, table %+v; want the mode and service-ips-v4's elements counted", st.Daemon, st.NFTables)
		}

		// By hand: the ClusterIP's element deleted, as nft delete element could.
		key := fmt.Sprintf("%s . tcp . %d", vip.Addr(), vip.Port())
		if _, err := f.inNode("nft", nil, "delete", "element", "inet", "kpr", "service-ips-v4", "{ "+key+" }"); err != nil {
			t.Fatal(err)
		}
		r := explain()
		if !slices.ContainsFunc(r.Divergences, func(d string) bool { return strings.HasPrefix(d, "map service-ips-v4 lacks "+key+" : goto service-") }) {
			t.Errorf("divergences %q: want the element of %s that service-ips-v4 lacks", r.Divergences, vip)
		}
		if got := verdictOf(r); got != "" {
			t.Errorf("explain shows %s in service-ips-v4 (%q) after it was deleted", vip, got)
		}
	})
}
