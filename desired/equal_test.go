package desired

import (
	"net/netip"
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
)

func TestEqual(t *testing.T) {
	b := func(s string) dataplane.Backend {
		ap := netip.MustParseAddrPort(s)
		return dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}
	}
	base := func() *dataplane.ServicePort {
		return &dataplane.ServicePort{
			Name:            dataplane.ServicePortName{Namespace: "ns", Name: "web", Port: "http", Protocol: dataplane.TCP},
			AffinityTimeout: time.Minute,
			Frontends: []dataplane.Frontend{{
				Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: dataplane.TCP, Kind: dataplane.NodePort,
				Backends:         []dataplane.Backend{b("10.1.0.1:8080"), b("10.1.0.2:8080")},
				ExternalBackends: []dataplane.Backend{b("10.1.0.1:8080")},
			}},
		}
	}
	cases := []struct {
		name   string
		change func(*dataplane.ServicePort) *dataplane.ServicePort
		equal  bool
	}{
		{name: "identical copies", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort { return sp }, equal: true},
		{name: "nil", change: func(*dataplane.ServicePort) *dataplane.ServicePort { return nil }},
		{name: "name", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort { sp.Name.Port = "https"; return sp }},
		{name: "protocol", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort { sp.Name.Protocol = dataplane.UDP; return sp }},
		{name: "affinity", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort { sp.AffinityTimeout = 0; return sp }},
		{name: "frontend address", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].Addr = netip.MustParseAddr("10.96.0.11")
			return sp
		}},
		{name: "frontend port", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort { sp.Frontends[0].Port = 81; return sp }},
		{name: "frontend kind", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].Kind = dataplane.ExternalIP
			return sp
		}},
		{name: "frontend protocol", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].Protocol = dataplane.UDP
			return sp
		}},
		{name: "extra frontend", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends = append(sp.Frontends, sp.Frontends[0])
			return sp
		}},
		{name: "backend port", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].Backends[1].Port = 8081
			return sp
		}},
		{name: "backend missing", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].Backends = sp.Frontends[0].Backends[:1]
			return sp
		}},
		{name: "external backends nil vs set", change: func(sp *dataplane.ServicePort) *dataplane.ServicePort {
			sp.Frontends[0].ExternalBackends = nil
			return sp
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, b := base(), c.change(base())
			if got := Equal(a, b); got != c.equal {
				t.Errorf("Equal(a, b) = %v, want %v", got, c.equal)
			}
			if got := Equal(b, a); got != c.equal {
				t.Errorf("Equal(b, a) = %v, want %v", got, c.equal)
			}
		})
	}

	t.Run("both nil", func(t *testing.T) {
		if !Equal(nil, nil) {
			t.Error("Equal(nil, nil) = false")
		}
	})
	t.Run("nil and empty ExternalBackends differ: use Backends vs drop", func(t *testing.T) {
		a, b := base(), base()
		a.Frontends[0].ExternalBackends = nil
		b.Frontends[0].ExternalBackends = []dataplane.Backend{}
		if Equal(a, b) {
			t.Error("nil and empty ExternalBackends compared equal")
		}
	})
	t.Run("nil and empty Backends are equal: both reject", func(t *testing.T) {
		a, b := base(), base()
		a.Frontends[0].Backends = nil
		b.Frontends[0].Backends = []dataplane.Backend{}
		if !Equal(a, b) {
			t.Error("nil and empty Backends compared different")
		}
	})
}
