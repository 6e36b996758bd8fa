package tcnat

import (
	"testing"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

// BPF time per packet of an established flow, as BPF_PROG_TEST_RUN
// measures it in the kernel: ingress (conntrack hit and DNAT) and egress
// (reverse NAT of the reply). Each packet is a run of its own: a repeated
// run would see the packet the previous one rewrote.
//
//	go test ./tests/tcnat -run '^$' -bench PerPacket -benchtime 100000x
func BenchmarkPerPacket(b *testing.B) {
	p := newProgs(b, loader.ConntrackTimeouts{})
	fam := families[0]
	fe, be := ap(fam.node, 30080), ap(fam.pod1, 8080)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, be)
	req := flow{src: ap(fam.client, 40001), dst: fe, proto: dataplane.TCP, tcpFlags: "A"}
	reply := flow{src: be, dst: req.src, proto: dataplane.TCP, tcpFlags: "A"}
	run(b, p.ingress, build(b, req)) // creates the flow
	for _, c := range []struct {
		name string
		f    flow
	}{{"ingress", req}, {"egress", reply}} {
		prog := p.ingress
		if c.name == "egress" {
			prog = p.egress
		}
		frame := build(b, c.f)
		b.Run(c.name, func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				ret, d, err := prog.Benchmark(frame, 1, nil)
				if err != nil || ret != actUnspec {
					b.Fatalf("verdict %d, %v", int32(ret), err)
				}
				total += d
			}
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "bpf-ns/packet")
		})
	}
	if s := p.stats(); s.NewFlows != 1 {
		b.Fatalf("%d flows created: the benchmark did not measure an established flow", s.NewFlows)
	}
}
