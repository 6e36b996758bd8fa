package loader

import (
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/maps"
)

// kpr_maglev is sized from kpr_rev_nat in every object: two entries (one
// per scope) for each reverse-NAT id, so a Service is refused by
// kpr_rev_nat before a frontend could lack room for its Maglev table. Its
// inner map template is left as compiled, and the kernel accepts the
// sized map.
func TestMaglevMapFollowsTheRevNatSize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sizes  MapSizes
		revNat uint32
	}{
		{"default", MapSizes{}, 131072},
		{"small", MapSizes{RevNat: 64}, 64},
		// Past half of the 65536 the object declares: two tables per
		// id no longer fit in the compiled size.
		{"large", MapSizes{RevNat: 40000}, 40000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, load := range objects {
				spec, err := load()
				if err != nil {
					t.Fatal(err)
				}
				applySizes(spec, tc.sizes)
				if got := spec.Maps[bpf.KprMapKprRevNat].MaxEntries; got != tc.revNat {
					t.Fatalf("kpr_rev_nat has max_entries %d, want %d", got, tc.revNat)
				}
				ms := spec.Maps[bpf.KprMapKprMaglev]
				if want := maps.MaglevEntriesPerRevNat * tc.revNat; ms.MaxEntries != want {
					t.Errorf("kpr_maglev has max_entries %d beside a kpr_rev_nat of %d, want %d", ms.MaxEntries, tc.revNat, want)
				}
				in := ms.InnerMap
				if in == nil || in.Type != ebpf.Array || in.KeySize != 4 || in.ValueSize != 4 ||
					in.MaxEntries != 16381 || in.Flags != unix.BPF_F_INNER_MAP {
					t.Errorf("kpr_maglev's inner map template changed: %+v", in)
				}
			}
			if tc.name != "small" {
				return
			}
			spec, err := bpf.LoadKpr()
			if err != nil {
				t.Fatal(err)
			}
			applySizes(spec, tc.sizes)
			ms := spec.Maps[bpf.KprMapKprMaglev].Copy()
			ms.Pinning = ebpf.PinNone
			m, err := ebpf.NewMap(ms)
			if err != nil {
				t.Skipf("create %s (needs root, or CAP_BPF): %v", bpf.KprMapKprMaglev, err)
			}
			defer m.Close()
			if m.MaxEntries() != 2*tc.revNat {
				t.Errorf("the kernel's kpr_maglev has max_entries %d, want %d", m.MaxEntries(), 2*tc.revNat)
			}
		})
	}
}

// kpr_ct_new has one LRU list per CPU, and the kernel rounds the size of
// such a map up to a multiple of the possible CPUs. Every object asks for
// the rounded size, so the spec equals what the kernel reports and a
// pinned map is adopted on the next start, not carried over each time.
func TestPerCPULRUSizeIsWhatTheKernelCreates(t *testing.T) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	asked := uint32(4*cpus + 1)
	want := uint32(5 * cpus)
	if cpus == 1 {
		want = asked
	}
	for _, load := range objects {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		applySizes(spec, MapSizes{ConntrackNew: asked})
		ms := spec.Maps[bpf.KprMapKprCtNew]
		if ms == nil {
			continue // an object without the tc programs' maps
		}
		if ms.Flags&unix.BPF_F_NO_COMMON_LRU == 0 {
			t.Fatalf("kpr_ct_new has flags %#x: want one LRU list per CPU", ms.Flags)
		}
		if ms.MaxEntries != want {
			t.Fatalf("kpr_ct_new asked for %d entries on %d possible CPUs has max_entries %d, want %d", asked, cpus, ms.MaxEntries, want)
		}
		cp := ms.Copy()
		cp.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(cp)
		if err != nil {
			t.Skipf("create %s (needs root, or CAP_BPF): %v", bpf.KprMapKprCtNew, err)
		}
		got := m.MaxEntries()
		m.Close()
		if got != ms.MaxEntries {
			t.Errorf("the kernel's kpr_ct_new has max_entries %d, the spec %d", got, ms.MaxEntries)
		}
	}
}
