package maps

import (
	"strings"
	"testing"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// persistedKinds are the svc_value.kind numbers pinned service maps hold,
// as every kpr so far wrote them. Reordering the Go constants, or
// renumbering enum svc_kind, must not change a single one: an upgraded kpr
// adopts maps written by the previous one.
var persistedKinds = []struct {
	kind dataplane.FrontendKind
	c    bpf.KprSvcKind
	disk uint8
}{
	{dataplane.ClusterIP, bpf.KprSvcKindSVC_KIND_CLUSTER_IP, 0},
	{dataplane.NodePort, bpf.KprSvcKindSVC_KIND_NODE_PORT, 1},
	{dataplane.ExternalIP, bpf.KprSvcKindSVC_KIND_EXTERNAL_IP, 2},
	{dataplane.LoadBalancer, bpf.KprSvcKindSVC_KIND_LOAD_BALANCER, 3},
}

func TestKindIsPersistedAsTheCEnumValue(t *testing.T) {
	for _, p := range persistedKinds {
		if uint32(p.c) != uint32(p.disk) {
			t.Errorf("enum svc_kind value for %s is %d, but pinned maps hold %d: never renumber enum svc_kind", p.kind, p.c, p.disk)
		}
		got, ok := kindToBPF(p.kind)
		if !ok || got != p.disk {
			t.Errorf("kindToBPF(%s) = %d, %v; want %d", p.kind, got, ok, p.disk)
		}
		back, ok := kindFromBPF(p.disk)
		if !ok || back != p.kind {
			t.Errorf("kindFromBPF(%d) = %s, %v; want %s", p.disk, back, ok, p.kind)
		}
	}
}

// A Go kind added without an enum svc_kind value and a row in svcKinds
// would have nothing to be stored as.
func TestEveryKindHasAPersistedValue(t *testing.T) {
	for n := 0; n < 256; n++ {
		k := dataplane.FrontendKind(n)
		if strings.HasPrefix(k.String(), "kind(") {
			continue // not a kind dataplane defines
		}
		if _, ok := kindToBPF(k); !ok {
			t.Errorf("dataplane.%s has no enum svc_kind value (bpf/types.h, maps.svcKinds)", k)
		}
	}
}

func TestServiceKindRoundTripsThroughTheServiceMap(t *testing.T) {
	f := newFakeMaps(t, 100, 100, 100)
	lb := f.lb()
	for i, p := range persistedKinds {
		svc := svcFor("10.96.0.1", uint16(80+i), "10.244.0.2:8080")
		svc.Kind = p.kind
		if err := lb.Upsert(svc); err != nil {
			t.Fatal(err)
		}
		if got := f.services.data[svc.bpfKey(0)].Kind; got != p.disk {
			t.Errorf("%s stored as kind %d, want %d", p.kind, got, p.disk)
		}
		// What a previous kpr left in the pinned map reads back the same.
		got, ok := f.lb().Get(svc.VIPKey)
		if !ok || got.Kind != p.kind {
			t.Errorf("adopted %s entry reads back as %s", p.kind, got.Kind)
		}
	}
}

func TestUnknownPersistedKindIsRewritten(t *testing.T) {
	f := newFakeMaps(t, 100, 100, 100)
	svc := svcFor("10.96.0.1", 80, "10.244.0.2:8080")
	svc.Kind = dataplane.NodePort
	if err := f.lb().Upsert(svc); err != nil {
		t.Fatal(err)
	}
	// A newer kpr's kind, or a damaged entry.
	master := f.services.data[svc.bpfKey(0)]
	master.Kind = 200
	f.services.data[svc.bpfKey(0)] = master

	lb := f.lb()
	if _, ok := kindFromBPF(200); ok {
		t.Fatal("kindFromBPF accepts a value enum svc_kind does not have")
	}
	got, ok := lb.Get(svc.VIPKey)
	if !ok || got.Kind != unknownKind {
		t.Fatalf("entry with persisted kind 200 reads as %s, want %s", got.Kind, unknownKind)
	}
	if lb.Matches(svc) {
		t.Fatal("an entry with an unknown kind matches the desired Service, so it would never be rewritten")
	}
	if err := lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	if k := f.services.data[svc.bpfKey(0)].Kind; k != 1 {
		t.Fatalf("rewritten entry holds kind %d, want 1 (NodePort)", k)
	}
}

func TestKindWithoutPersistedValueIsRefused(t *testing.T) {
	f := newFakeMaps(t, 100, 100, 100)
	lb := f.lb()
	svc := svcFor("10.96.0.1", 80, "10.244.0.2:8080")
	svc.Kind = unknownKind
	if err := lb.Upsert(svc); err == nil || !strings.Contains(err.Error(), "enum svc_kind") {
		t.Fatalf("Upsert of a kind without a persisted value: err = %v, want a refusal naming enum svc_kind", err)
	}
	if len(f.services.data) != 0 {
		t.Fatal("refused Service was written")
	}
}
