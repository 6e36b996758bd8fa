package maps

import (
	"net/netip"
	"reflect"
	"sort"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
)

func udpSvc(vip string, scope Scope, backends ...string) Service {
	svc := Service{VIPKey: VIPKey{VIP: VIP{Addr: netip.MustParseAddr(vip), Port: 53, Proto: dataplane.UDP}, Scope: scope}}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		svc.Backends = append(svc.Backends, dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return svc
}

func removedStrings(rs []RemovedBackend) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Frontend.String()+"->"+r.Backend.String())
	}
	sort.Strings(out)
	return out
}

func TestRemovedUDPBackendsAreRecorded(t *testing.T) {
	lb := NewInMemory(100, 100, 100)
	if err := lb.Upsert(udpSvc("10.96.0.10", ScopeInternal, "10.244.0.1:53", "10.244.0.2:53")); err != nil {
		t.Fatal(err)
	}
	if got := lb.TakeRemovedUDPBackends(); got != nil {
		t.Fatalf("recording is off by default, got %v", got)
	}
	lb.RecordRemovedUDPBackends()

	tcp := udpSvc("10.96.0.11", ScopeInternal, "10.244.0.1:53")
	tcp.Proto = dataplane.TCP
	steps := []struct {
		name string
		do   func() error
		want []string
	}{
		{"new services remove nothing", func() error {
			return lb.Upsert(tcp, udpSvc("10.96.0.10", ScopeExternal, "10.244.0.1:53"))
		}, []string{}},
		{"a backend replaced, one kept, the same backend in two slots", func() error {
			return lb.Upsert(udpSvc("10.96.0.10", ScopeInternal, "10.244.0.2:53", "10.244.0.3:53", "10.244.0.3:53"))
		}, []string{"10.96.0.10:53->10.244.0.1:53"}},
		{"TCP and the external scope do not count", func() error {
			tcp.Backends = nil
			return lb.Upsert(tcp, udpSvc("10.96.0.10", ScopeExternal))
		}, []string{}},
		{"a deleted frontend removes all its backends once each", func() error {
			return lb.Delete(udpSvc("10.96.0.10", ScopeInternal).VIPKey)
		}, []string{"10.96.0.10:53->10.244.0.2:53", "10.96.0.10:53->10.244.0.3:53"}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := removedStrings(lb.TakeRemovedUDPBackends()); !reflect.DeepEqual(got, s.want) {
			t.Fatalf("%s: removed %v, want %v", s.name, got, s.want)
		}
	}
}

func TestRefusedWriteRecordsNothing(t *testing.T) {
	lb := NewInMemory(4, 100, 100)
	lb.RecordRemovedUDPBackends()
	if err := lb.Upsert(udpSvc("10.96.0.10", ScopeInternal, "10.244.0.1:53")); err != nil {
		t.Fatal(err)
	}
	// Five entries do not fit a service map of four: refused whole.
	if err := lb.Upsert(udpSvc("10.96.0.10", ScopeInternal, "10.244.0.2:53", "10.244.0.3:53", "10.244.0.4:53", "10.244.0.5:53")); err == nil {
		t.Fatal("an oversized write was accepted")
	}
	if got := lb.TakeRemovedUDPBackends(); len(got) != 0 {
		t.Fatalf("a refused write recorded %v", got)
	}
}

func TestSockTermKeyEncoding(t *testing.T) {
	r := RemovedBackend{Frontend: netip.MustParseAddrPort("10.96.0.10:53"), Backend: netip.MustParseAddrPort("[fd00::1]:5353")}
	k := r.SockTermKey()
	if addrFromBPF(k.FrontendAddr) != r.Frontend.Addr() || portFromBPF(k.FrontendPort) != 53 ||
		addrFromBPF(k.BackendAddr) != r.Backend.Addr() || portFromBPF(k.BackendPort) != 5353 {
		t.Fatalf("key %+v does not encode %v", k, r)
	}
	if k.FrontendAddr != addrToBPF(netip.MustParseAddr("::ffff:10.96.0.10")) {
		t.Fatal("IPv4 frontend is not stored v4-mapped, as kpr_sock_rev stores it")
	}
}
