package loader

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"

	"github.com/kpr-io/kpr/tests/harness"
)

// A program the kernel's verifier rejects comes back as an error that wraps
// *ebpf.VerifierError, with the verifier's whole log in its text: callers
// can tell a rejection from other load failures, and the log says why.
// The log's wording comes from the kernel, so this runs on every kernel of
// the matrix.
func TestVerifierRejectionKeepsTheErrorAndItsLog(t *testing.T) {
	harness.RequireRoot(t)
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{
		"kpr_rejected": {
			Name: "kpr_rejected", Type: ebpf.SocketFilter, License: "GPL",
			// R2 is never written, and the verifier refuses to read it.
			Instructions: asm.Instructions{asm.Mov.Reg(asm.R0, asm.R2), asm.Return()},
		},
	}}
	var objs struct {
		Prog *ebpf.Program `ebpf:"kpr_rejected"`
	}
	err := loadAgainstShared(spec, MapSizes{}, nil, btf.NewCache(), &objs)
	if err == nil {
		objs.Prog.Close()
		t.Fatal("the verifier accepted a program that reads an uninitialised register")
	}
	var verr *ebpf.VerifierError
	if !errors.As(err, &verr) {
		t.Fatalf("error %q does not wrap *ebpf.VerifierError", err)
	}
	if !strings.Contains(err.Error(), "R2 !read_ok") {
		t.Errorf("error %q lacks the verifier's log (R2 !read_ok)", err)
	}
}
