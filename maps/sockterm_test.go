package maps

import (
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
)

func TestSockTermKeyEncoding(t *testing.T) {
	r := dataplane.RemovedBackend{Frontend: netip.MustParseAddrPort("10.96.0.10:53"), Backend: netip.MustParseAddrPort("[fd00::1]:5353")}
	k := sockTermKeys([]dataplane.RemovedBackend{r})[0]
	if addrFromBPF(k.FrontendAddr) != r.Frontend.Addr() || portFromBPF(k.FrontendPort) != 53 ||
		addrFromBPF(k.BackendAddr) != r.Backend.Addr() || portFromBPF(k.BackendPort) != 5353 {
		t.Fatalf("key %+v does not encode %v", k, r)
	}
	if k.FrontendAddr != addrToBPF(netip.MustParseAddr("::ffff:10.96.0.10")) {
		t.Fatal("IPv4 frontend is not stored v4-mapped, as kpr_sock_rev stores it")
	}
}
