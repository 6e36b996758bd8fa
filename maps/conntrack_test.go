package maps

import (
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kpr-io/kpr/bpf"
)

// The Go copies of the conntrack enums match bpf/types.h, as the tc
// programs' object carries them.
func TestConntrackEnumsMatchTheObject(t *testing.T) {
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]uint64{
		"ct_dir": {"CT_DIR_FORWARD": ctDirForward, "CT_DIR_REPLY": ctDirReply},
		"ct_flags": {"CT_F_REPLIED": ctFlagReplied, "CT_F_FIN": ctFlagFin, "CT_F_RST": ctFlagRst, "CT_F_SNAT": ctFlagSNAT,
			"CT_F_ACK_FWD": ctFlagAckFwd, "CT_F_ACK_REPLY": ctFlagAckReply, "CT_F_FIN_FWD": ctFlagFinFwd, "CT_F_FIN_REPLY": ctFlagFinReply},
	}
	for name, values := range want {
		var e *btf.Enum
		if err := spec.Types.TypeByName(name, &e); err != nil {
			t.Fatalf("enum %s: %v", name, err)
		}
		if len(e.Values) != len(values) {
			t.Errorf("enum %s has %d values, Go knows %d: add the new ones to maps/conntrack.go", name, len(e.Values), len(values))
		}
		for _, v := range e.Values {
			if got, ok := values[v.Name]; !ok || got != v.Value {
				t.Errorf("%s = %d in bpf/types.h, %d (known %v) in maps/conntrack.go", v.Name, v.Value, got, ok)
			}
		}
	}
}
