package tcnat

import (
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/ebpfplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/tests/harness"
)

func udpServicePort(name string, fe netip.AddrPort, backends ...netip.AddrPort) *dataplane.ServicePort {
	var bs []dataplane.Backend
	for _, b := range backends {
		bs = append(bs, dataplane.Backend{Addr: b.Addr(), Port: b.Port()})
	}
	return &dataplane.ServicePort{
		Name: dataplane.ServicePortName{Namespace: "tcnat", Name: name, Protocol: dataplane.UDP},
		Frontends: []dataplane.Frontend{
			{Addr: fe.Addr(), Port: fe.Port(), Protocol: dataplane.UDP, Kind: dataplane.NodePort, Backends: bs},
		},
	}
}

// After its backend leaves the Service, a UDP flow from the same client
// port reaches a live backend within 2 s: the eBPF backend deletes the tc
// conntrack entries of the removed backend, as kube-proxy deletes the
// netfilter ones. The removed backend stays a backend of another Service,
// so its id stays in the backend map and the programs' own liveness check
// would keep the flow on it for as long as the client keeps sending; the
// removed pod still answers, so a reply from it shows the stale flow.
func TestUDPFlowLeavesRemovedBackend(t *testing.T) {
	top := newTopology(t, 2, loader.TCAttachAuto)
	plane := ebpfplane.New(top.lb, zaptest.NewLogger(t))
	if err := plane.Reconcile(nil); err != nil {
		t.Fatal(err)
	}
	for _, fam := range topoFamilies {
		t.Run(fam.name, func(t *testing.T) {
			fe := netip.AddrPortFrom(nodeAddr(fam.v6), 30096)
			other := netip.AddrPortFrom(nodeAddr(fam.v6), 30097)
			all := top.backends(fe.Addr(), dataplane.UDP, top.pods...)
			dns := udpServicePort("dns-"+fam.name, fe, all...)
			keeper := udpServicePort("keeper-"+fam.name, other, all...)
			if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{dns.Name: dns, keeper.Name: keeper}); err != nil {
				t.Fatal(err)
			}
			// One socket, so one client port, for the whole test.
			c, err := harness.ListenUDP(top.client.NetNS, fe.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ask := func() (string, error) {
				payload := []byte("who-" + randomHex(6))
				if err := c.SetDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
					return "", err
				}
				if _, err := c.WriteToUDPAddrPort(payload, fe); err != nil {
					return "", err
				}
				buf := make([]byte, 2048)
				n, _, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					return "", err
				}
				name, _, _ := cutLine(buf[:n])
				return name, nil
			}
			first, err := ask()
			if err != nil {
				t.Fatalf("UDP to %s from outside: %v", fe, err)
			}
			var stay netip.AddrPort
			for i, p := range top.pods {
				if p.Name != first {
					stay = all[i]
				}
			}
			// The backend that answered leaves this Service only.
			next := udpServicePort(dns.Name.Name, fe, stay)
			if err := plane.Apply(map[dataplane.ServicePortName]*dataplane.ServicePort{dns.Name: next}); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			var last string
			for {
				who, err := ask()
				if err == nil && who != first {
					break
				}
				last = who
				if err != nil {
					last = err.Error()
				}
				if time.Now().After(deadline) {
					t.Fatalf("2 s after %s left %s, the flow from one client port still gets %q", first, fe, last)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// cutLine splits a UDP echo reply, "<pod>\n<payload>".
func cutLine(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == '\n' {
			return string(b[:i]), b[i+1:], true
		}
	}
	return string(b), nil, false
}
