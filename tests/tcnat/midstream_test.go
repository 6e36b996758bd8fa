package tcnat

import (
	"net/netip"
	"testing"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/maps/maglev"
)

// A TCP segment other than a SYN, of a flow kpr does not know, passes
// untranslated and counted: it belongs to a connection the kernel's own
// conntrack may carry (one kube-proxy's NAT made before kpr took over the
// node), which a fresh pick would send to a backend that resets it. A SYN
// from the same port is then a new flow, and translated.
func TestMidstreamSegmentOfAnUnknownFlowPasses(t *testing.T) {
	p := newProgs(t, loader.ConntrackTimeouts{})
	fam := families[0]
	fe := ap(fam.node, 30083)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, ap(fam.pod1, 8080))
	client := ap(fam.client, 44000)

	ret, got := p.in(flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "A"})
	if ret != actUnspec || got.dst != fe {
		t.Fatalf("ACK of an unknown flow: verdict %d, to %s; want passed on to %s untranslated", int32(ret), got.dst, fe)
	}
	if s := p.stats(); s.Midstream != 1 || s.NewFlows != 0 {
		t.Errorf("counters %+v: want one midstream segment and no flow", s)
	}
	if _, got := p.in(flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "S"}); got.dst != ap(fam.pod1, 8080) {
		t.Fatalf("SYN from the same port went to %s, want the backend", got.dst)
	}
	if _, got := p.in(flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "A"}); got.dst != ap(fam.pod1, 8080) {
		t.Errorf("ACK of the flow the SYN opened went to %s, want the backend", got.dst)
	}
}

// A Maglev frontend translates such a segment all the same: its table
// names the flow's backend on every node, which is what keeps a flow alive
// when an ECMP router moves it to another node.
func TestMidstreamSegmentToAMaglevFrontendIsTranslated(t *testing.T) {
	n := newMaglevNode(t, maglev.DefaultTableSize)
	backends := maglevBackends(3)
	n.apply(lbService("web", 0, backends...))
	fe := ap(maglevLB, 80)
	client := ap(netip.MustParseAddr("198.51.100.7"), 45000)
	_, syn := n.in(flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "S"})
	n.flushConntrack()
	ret, got := n.in(flow{src: client, dst: fe, proto: dataplane.TCP, tcpFlags: "A"})
	if ret != actUnspec || got.dst != syn.dst {
		t.Errorf("ACK after the flow's entries were lost: verdict %d, to %s; want the backend the SYN got, %s", int32(ret), got.dst, syn.dst)
	}
}
