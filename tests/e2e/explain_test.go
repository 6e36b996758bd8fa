package e2e

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/kprproc"
	"github.com/kpr-io/kpr/tests/kubeobj"
)

// explainResult is the part of `kpr explain -o json` the tests read.
type explainResult struct {
	Explanation struct {
		AffinitySeconds int `json:"sessionAffinitySeconds"`
		Ports           []struct {
			Families []struct {
				Endpoints []struct {
					Backend string `json:"backend"`
					Cluster string `json:"cluster"`
					Local   string `json:"local"`
				} `json:"endpoints"`
			} `json:"families"`
			Frontends []struct {
				Frontend string   `json:"frontend"`
				Scope    string   `json:"scope"`
				Backends []string `json:"backends"`
			} `json:"frontends"`
		} `json:"ports"`
	} `json:"explanation"`
	Maps []struct {
		Frontend string `json:"frontend"`
		Matches  bool   `json:"matches"`
	} `json:"maps"`
	MapsError   string   `json:"mapsError"`
	Divergences []string `json:"divergences"`
}

// decision returns the cluster and local decision of the endpoint of pod.
func (r explainResult) decision(f *fixture, pod string) (cluster, local string) {
	want := netip.AddrPortFrom(f.pod(pod).IPv4, tcpPort).String()
	for _, p := range r.Explanation.Ports {
		for _, fam := range p.Families {
			for _, e := range fam.Endpoints {
				if e.Backend == want {
					return e.Cluster, e.Local
				}
			}
		}
	}
	return "(no decision)", "(no decision)"
}

// clusterIPBackends returns the backends explain says the ClusterIP
// frontend's internal scope gets.
func (r explainResult) clusterIPBackends() []string {
	for _, p := range r.Explanation.Ports {
		for _, fe := range p.Frontends {
			if fe.Scope == "internal" {
				return fe.Backends
			}
		}
	}
	return nil
}

// kprCommand runs a kpr subcommand against the fixture's daemon and API.
func (f *fixture) kprCommand(t *testing.T, args ...string) []byte {
	t.Helper()
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append(args, "--bpf-root", f.kpr.BPFRoot)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("kpr %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("kpr %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// kprStatus runs kpr status with args and returns what it printed and its
// exit code: 0 (healthy), 3 (not running) or 4 (unhealthy), each of
// which comes with the whole report; any other code fails the test.
func (f *fixture) kprStatus(t *testing.T, args ...string) ([]byte, int) {
	t.Helper()
	bin, err := kprproc.Binary()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, append(append([]string{"status"}, args...), "--bpf-root", f.kpr.BPFRoot)...).Output()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &exit) && (exit.ExitCode() == 3 || exit.ExitCode() == 4):
		return out, exit.ExitCode()
	case errors.As(err, &exit):
		t.Fatalf("kpr status %s: %v: %s", strings.Join(args, " "), err, exit.Stderr)
	default:
		t.Fatalf("kpr status %s: %v", strings.Join(args, " "), err)
	}
	return nil, 0
}

func (f *fixture) explain(t *testing.T, target string) explainResult {
	t.Helper()
	out := f.kprCommand(t, "explain", target, "-o", "json", "--kubeconfig", f.cluster.KubeconfigPath, "--hostname-override", nodeName)
	var r explainResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("parse kpr explain output: %v\n%s", err, out)
	}
	return r
}

// explainSynced waits until explain finds the maps holding what kpr wants
// for target (the daemon caught up) and check accepts the explanation.
func (f *fixture) explainSynced(t *testing.T, target string, check func(explainResult) error) explainResult {
	t.Helper()
	var r explainResult
	waitUntil(t, convergeTimeout, "kpr explain "+target, func() error {
		r = f.explain(t, target)
		if r.MapsError != "" || len(r.Divergences) > 0 || len(r.Maps) == 0 {
			return fmt.Errorf("maps not in step: %s %v %+v", r.MapsError, r.Divergences, r.Maps)
		}
		return check(r)
	})
	return r
}

func wantDecision(r explainResult, f *fixture, pod, cluster, local string) error {
	c, l := r.decision(f, pod)
	if !strings.Contains(c, cluster) || !strings.Contains(l, local) {
		return fmt.Errorf("%s: cluster %q local %q, want %q and %q", pod, c, l, cluster, local)
	}
	return nil
}

func wantBackends(r explainResult, f *fixture, pods ...string) error {
	var want []string
	for _, p := range pods {
		want = append(want, netip.AddrPortFrom(f.pod(p).IPv4, tcpPort).String())
	}
	slices.Sort(want)
	if got := r.clusterIPBackends(); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		return fmt.Errorf("ClusterIP backends %v, want %v", got, want)
	}
	return nil
}

// TestExplain: `kpr explain` against the real API server and maps names
// the reason for every endpoint left out, the backend set, and a map
// entry deleted by hand. The periodic reconcile is slowed down so that it
// does not repair the deleted entry before explain looks.
func TestExplain(t *testing.T) {
	f := newFixture(t, "--sync-period", "10m")
	for _, sc := range []struct {
		name string
		run  func(t *testing.T, f *fixture, ns string)
	}{
		{"explain-topology", testExplainTopology},
		{"explain-local", testExplainLocal},
		{"explain-terminating", testExplainTerminating},
		{"explain-affinity", testExplainAffinity},
		{"explain-deleted-entry", testExplainDeletedEntry},
		{"status", testStatus},
		{"status-api-outage", testStatusAPIOutage},
	} {
		t.Run(sc.name, func(t *testing.T) {
			sc.run(t, f, f.namespace(t, sc.name))
			f.requireRunning(t)
		})
	}
}

func testExplainTopology(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "topo", tcp80)
	svc.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferSameZone)
	svc = f.createService(t, svc)
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, zoneHints(nodeZone)), f.ep("pod-b", v4, zoneHints(otherZone)))
	f.explainSynced(t, ns+"/topo", func(r explainResult) error {
		return errors.Join(wantBackends(r, f, "pod-a"),
			wantDecision(r, f, "pod-a", "used", ""),
			wantDecision(r, f, "pod-b", "topology: hinted for zone(s) "+otherZone+", not this node's zone "+nodeZone, ""))
	})
}

func testExplainLocal(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "local", tcp80)
	svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	svc = f.createService(t, svc)
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4, onNode(nodeName)), f.ep("pod-b", v4, onNode(otherNode)))
	f.explainSynced(t, ns+"/local:tcp", func(r explainResult) error {
		return errors.Join(wantBackends(r, f, "pod-a"),
			wantDecision(r, f, "pod-a", "used", "used"),
			wantDecision(r, f, "pod-b", "used", "not local: on node "+otherNode))
	})

	t.Log("no local endpoint: the ClusterIP refuses, and explain says why for each")
	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, onNode(otherNode)), f.ep("pod-c", v4, onNode(otherNode)))
	f.explainSynced(t, ns+"/local", func(r explainResult) error {
		return errors.Join(wantBackends(r, f),
			wantDecision(r, f, "pod-b", "used", "not local"),
			wantDecision(r, f, "pod-c", "used", "not local"))
	})
}

func testExplainTerminating(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "term", tcp80))
	terminatingServing := conditions(false, true, true)
	f.setEndpoints(t, svc, v4, f.ep("pod-a", v4), f.ep("pod-b", v4, terminatingServing))
	f.explainSynced(t, ns+"/term", func(r explainResult) error {
		return errors.Join(wantBackends(r, f, "pod-a"),
			wantDecision(r, f, "pod-b", "terminating, and ready endpoints exist", ""))
	})

	t.Log("nothing ready: the serving terminating endpoints are the fallback")
	f.setEndpoints(t, svc, v4, f.ep("pod-b", v4, terminatingServing), f.ep("pod-c", v4, conditions(false, false, true)))
	f.explainSynced(t, ns+"/term", func(r explainResult) error {
		return errors.Join(wantBackends(r, f, "pod-b"),
			wantDecision(r, f, "pod-b", "used: terminating fallback", ""),
			wantDecision(r, f, "pod-c", "terminating and not serving", ""))
	})
}

func testExplainAffinity(t *testing.T, f *fixture, ns string) {
	svc := kubeobj.Service(ns, "sticky", tcp80)
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	svc = f.createService(t, svc)
	f.setEndpoints(t, svc, v4, f.eps("pod-a", "pod-b")...)
	// The maps matching includes their affinity timeout.
	f.explainSynced(t, ns+"/sticky", func(r explainResult) error {
		if r.Explanation.AffinitySeconds != 600 {
			return fmt.Errorf("affinity %d s, want 600", r.Explanation.AffinitySeconds)
		}
		return wantBackends(r, f, "pod-a", "pod-b")
	})
}

func testExplainDeletedEntry(t *testing.T, f *fixture, ns string) {
	svc := f.createService(t, kubeobj.Service(ns, "broken", tcp80))
	f.setEndpoints(t, svc, v4, f.eps("pod-a")...)
	vip := clusterIP(t, svc, v1.IPv4Protocol, 80)
	f.explainSynced(t, vip.String(), func(r explainResult) error { return wantBackends(r, f, "pod-a") })

	deleteMasterEntry(t, f.kpr.BPFRoot, vip)
	r := f.explain(t, vip.String())
	want := vip.String() + "/TCP internal scope: missing from the service map"
	if len(r.Divergences) != 1 || !strings.HasPrefix(r.Divergences[0], want) {
		t.Errorf("divergences = %q, want one starting %q", r.Divergences, want)
	}
	// The table says it too, in the line an operator reads first.
	table := string(f.kprCommand(t, "explain", ns+"/broken", "--kubeconfig", f.cluster.KubeconfigPath, "--hostname-override", nodeName))
	if !strings.Contains(table, "DIVERGENCE: "+want) {
		t.Errorf("kpr explain table does not name the divergence:\n%s", table)
	}
	t.Logf("kpr explain %s/broken:\n%s", ns, table)
}

// deleteMasterEntry deletes the slot-0 entry of vip's internal scope from
// the pinned service map, as an operator with bpftool could.
func deleteMasterEntry(t *testing.T, bpfRoot string, vip netip.AddrPort) {
	t.Helper()
	m, err := loader.OpenPinnedMaps(bpfRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b := vip.Addr().As16()
	var key bpf.KprSvcKey
	for i := range key.Addr {
		key.Addr[i] = binary.NativeEndian.Uint32(b[i*4:])
	}
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], vip.Port())
	key.Port = binary.NativeEndian.Uint16(port[:])
	key.Proto = uint8(dataplane.TCP)
	key.Scope = uint8(maps.ScopeInternal)
	if err := m.KprServices.Delete(key); err != nil {
		t.Fatalf("delete the service map entry of %s: %v", vip, err)
	}
}
