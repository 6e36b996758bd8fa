package tcnat

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/kpr-io/kpr/dataplane"
)

// What BenchmarkPerPacket's numbers hold besides kpr's programs: the same
// measurement (one BPF_PROG_TEST_RUN per packet, the kernel's own timing)
// of a program that only returns TC_ACT_UNSPEC, on the same frame. Its time
// is the harness's: entering the run, reading the clock around it, and
// the program dispatch. Subtract it from BenchmarkPerPacket's to get the
// time kpr's programs add to a packet. "repeat" runs the empty program
// many times in one call, so the clock is read once for all of them: the
// difference to "single" is what the clock reads cost.
//
//	go test ./tests/tcnat -run '^$' -bench 'PerPacket' -benchtime 100000x
func BenchmarkPerPacketEmptyProgram(b *testing.B) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}) // TC_ACT_UNSPEC
	if err != nil {
		b.Fatalf("load the empty tc program: %v", err)
	}
	defer prog.Close()
	fam := families[0]
	frame := build(b, flow{src: ap(fam.client, 40001), dst: ap(fam.node, 30080), proto: dataplane.TCP, tcpFlags: "A"})
	b.Run("single", func(b *testing.B) {
		var total time.Duration
		for i := 0; i < b.N; i++ {
			total += runOnce(b, prog, frame, 1)
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "bpf-ns/packet")
	})
	b.Run("repeat", func(b *testing.B) {
		const repeat = 1000
		var total time.Duration
		for i := 0; i < (b.N+repeat-1)/repeat; i++ {
			total += runOnce(b, prog, frame, repeat) * repeat
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64((b.N+repeat-1)/repeat*repeat), "bpf-ns/packet")
	})
}

// runOnce runs prog repeat times on frame in one BPF_PROG_TEST_RUN and
// returns the kernel's time per run.
func runOnce(b *testing.B, prog *ebpf.Program, frame []byte, repeat int) time.Duration {
	ret, d, err := prog.Benchmark(frame, repeat, nil)
	if err != nil || ret != actUnspec {
		b.Fatalf("verdict %d, %v", int32(ret), err)
	}
	return d
}
