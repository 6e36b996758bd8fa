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
// the program dispatch. BenchmarkPerPacket measures it too, in the same
// run, and subtracts it. "repeat" runs the empty program many times in
// one call, so the clock is read once for all of them: the difference to
// "single" is what the clock reads cost.
//
//	go test ./tests/tcnat -run '^$' -bench 'PerPacket' -benchtime 100000x
func BenchmarkPerPacketEmptyProgram(b *testing.B) {
	prog := emptyProgram(b)
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

// emptyProgram is a tc program that returns TC_ACT_UNSPEC and does
// nothing else.
func emptyProgram(tb testing.TB) *ebpf.Program {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}}) // TC_ACT_UNSPEC
	if err != nil {
		tb.Fatalf("load the empty tc program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	return prog
}

// restoringProgram is a tc program that writes frame over the packet it
// is given, then tail-calls target. A BPF_PROG_TEST_RUN with repeat runs
// the programs over one packet again and again; with this in front, each
// run of target sees frame as sent, not the packet its previous run
// rewrote. Its own cost is measured with the empty program as target.
func restoringProgram(tb testing.TB, frame []byte, target *ebpf.Program) *ebpf.Program {
	tb.Helper()
	frames, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(frame)), MaxEntries: 1})
	if err != nil {
		tb.Fatalf("create the map of the frame to restore: %v", err)
	}
	defer frames.Close()
	if err := frames.Put(uint32(0), frame); err != nil {
		tb.Fatalf("write the frame to restore: %v", err)
	}
	targets, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ProgramArray, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tb.Fatalf("create the program array: %v", err)
	}
	// Open as long as the program is: the kernel empties a program
	// array when user space lets go of it.
	tb.Cleanup(func() { targets.Close() })
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, frames.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "fail"),
		// bpf_skb_store_bytes(skb, 0, frame, len(frame), 0)
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R0),
		asm.Mov.Imm(asm.R4, int32(len(frame))),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "fail"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, targets.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnTailCall.Call(),
		// Reached only if the tail call failed: a verdict the
		// benchmark rejects.
		asm.Mov.Imm(asm.R0, actShot).WithSymbol("fail"),
		asm.Return(),
	}})
	if err != nil {
		tb.Fatalf("load the restoring tc program: %v", err)
	}
	tb.Cleanup(func() { prog.Close() })
	if err := targets.Put(uint32(0), target); err != nil {
		tb.Fatalf("put the program to measure into the program array (a tail call must be able to reach it): %v", err)
	}
	return prog
}

// runOnce runs prog repeat times on frame in one BPF_PROG_TEST_RUN and
// returns the kernel's time per run.
func runOnce(b *testing.B, prog *ebpf.Program, frame []byte, repeat int) time.Duration {
	return runCounted(b, prog, frame, repeat, nil)
}

// runCounted is runOnce that adds to *interrupted the calls a signal cut
// short: the library runs those again from the start, so the program ran
// up to repeat times more than asked.
func runCounted(b *testing.B, prog *ebpf.Program, frame []byte, repeat int, interrupted *int) time.Duration {
	var reset func()
	if interrupted != nil {
		reset = func() { *interrupted++ }
	}
	ret, d, err := prog.Benchmark(frame, repeat, reset)
	if err != nil || ret != actUnspec {
		b.Fatalf("verdict %d, %v", int32(ret), err)
	}
	return d
}
