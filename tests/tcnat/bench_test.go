package tcnat

import (
	"bytes"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
)

// BPF time per packet of an established flow, as BPF_PROG_TEST_RUN
// measures it in the kernel: ingress (conntrack hit and DNAT) and egress
// (reverse NAT of the reply). Each is measured two ways, both against a
// baseline measured the same way in the same loop, run for run, so that
// a load change on the machine hits both alike:
//
//   - single: one run per packet. The kernel's time of a single run holds
//     two clock reads and the run's setup; the baseline is the empty
//     program (bench_overhead_test.go) on the same frame.
//   - repeat: 1,000 runs per call, the clock read once for all. A
//     repeated run sees the packet the run before rewrote, so each run
//     first writes the frame back and then tail-calls the program
//     (restoringProgram); the baseline is the same with the empty
//     program as the target.
//
// net-ns/packet is the program's time minus its baseline's: what kpr's
// program adds to a packet.
//
//	go test ./tests/tcnat -run '^$' -bench PerPacket -benchtime 100000x
func BenchmarkPerPacket(b *testing.B) {
	p := newProgs(b, loader.ConntrackTimeouts{})
	fam := families[0]
	fe, be := ap(fam.node, 30080), ap(fam.pod1, 8080)
	p.upsert(dataplane.NodePort, maps.ScopeInternal, fe, dataplane.TCP, be)
	req := flow{src: ap(fam.client, 40001), dst: fe, proto: dataplane.TCP, tcpFlags: "A"}
	reply := flow{src: be, dst: req.src, proto: dataplane.TCP, tcpFlags: "A"}
	syn := req
	syn.tcpFlags = "S"
	run(b, p.ingress, build(b, syn)) // creates the flow
	empty := emptyProgram(b)
	for _, c := range []struct {
		name string
		prog *ebpf.Program
		f    flow
		// count is the counter that each packet of the flow bumps.
		count func() uint64
	}{
		{"ingress", p.ingress, req, func() uint64 { return p.stats().Translated }},
		{"egress", p.egress, reply, func() uint64 { return p.stats().Reversed }},
	} {
		frame := build(b, c.f)
		b.Run(c.name+"/single", func(b *testing.B) {
			var prog, base time.Duration
			for i := 0; i < b.N; i++ {
				prog += runOnce(b, c.prog, frame, 1)
				base += runOnce(b, empty, frame, 1)
			}
			reportNet(b, prog, base, b.N)
		})
		b.Run(c.name+"/repeat", func(b *testing.B) {
			const repeat = 1000
			restored := restoringProgram(b, frame, c.prog)
			restoredBase := restoringProgram(b, frame, empty)
			sameAsSingleRuns(b, c.prog, restored, frame)
			calls := (b.N + repeat - 1) / repeat
			count0 := c.count()
			var prog, base time.Duration
			interrupted := 0
			for i := 0; i < calls; i++ {
				prog += runCounted(b, restored, frame, repeat, &interrupted) * repeat
				base += runOnce(b, restoredBase, frame, repeat) * repeat
			}
			// Every repeated run translated the packet: none saw it
			// already rewritten.
			runs := uint64(calls * repeat)
			if got := c.count() - count0; got < runs || got > runs+uint64(interrupted*repeat) {
				b.Fatalf("%d runs of the %s program (%d calls interrupted and run again) counted %d packets translated",
					runs, c.name, interrupted, got)
			}
			reportNet(b, prog, base, calls*repeat)
		})
	}
	if s := p.stats(); s.NewFlows != 1 {
		b.Fatalf("%d flows created: the benchmark did not measure an established flow", s.NewFlows)
	}
}

// reportNet reports the program's and the baseline's time per packet over
// n packets each, and the difference.
func reportNet(b *testing.B, prog, base time.Duration, n int) {
	perPacket := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(n) }
	b.ReportMetric(perPacket(prog), "bpf-ns/packet")
	b.ReportMetric(perPacket(base), "baseline-ns/packet")
	b.ReportMetric(perPacket(prog-base), "net-ns/packet")
}

// sameAsSingleRuns fails unless three repeated runs of restored on frame
// leave the packet that one run of prog leaves: each run saw frame.
func sameAsSingleRuns(b *testing.B, prog, restored *ebpf.Program, frame []byte) {
	b.Helper()
	_, want := run(b, prog, frame)
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Repeat: 3}
	ret, err := restored.Run(opts)
	if err != nil || ret != actUnspec {
		b.Fatalf("repeated runs through the restoring program: verdict %d, %v", int32(ret), err)
	}
	if !bytes.Equal(opts.DataOut, want) || bytes.Equal(want, frame) {
		b.Fatalf("repeated runs left\n%x\none run leaves\n%x\nfrom\n%x", opts.DataOut, want, frame)
	}
}
