package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// The Go copies of enum svc_flags and SRC_RANGE_FRONTEND_BITS match
// bpf/types.h, as the tc programs' object carries them.
func TestSourceRangeConstantsMatchTheObject(t *testing.T) {
	spec, err := bpf.LoadTcNodeport()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName("svc_flags", &e); err != nil {
		t.Fatalf("enum svc_flags: %v", err)
	}
	if len(e.Values) != 1 || e.Values[0].Name != "SVC_F_SOURCE_RANGES" || e.Values[0].Value != svcFlagSourceRanges {
		t.Errorf("enum svc_flags is %+v in bpf/types.h, Go knows SVC_F_SOURCE_RANGES = %d (maps/lb.go)", e.Values, svcFlagSourceRanges)
	}
	// The frontend part of the key is what SRC_RANGE_FRONTEND_BITS says.
	var key *btf.Struct
	if err := spec.Types.TypeByName("src_range_key", &key); err != nil {
		t.Fatal(err)
	}
	var frontendBits, sourceAt uint32
	for _, m := range key.Members {
		switch m.Name {
		case "frontend":
			frontendBits = uint32(m.Offset)
		case "source":
			sourceAt = uint32(m.Offset)
		}
	}
	if got := sourceAt - frontendBits; got != srcRangeFrontendBits {
		t.Errorf("src_range_key has %d bits between frontend and source, srcRangeFrontendBits is %d", got, srcRangeFrontendBits)
	}
}

func TestSourceRangeKeyRoundTrip(t *testing.T) {
	for _, tc := range []struct{ vip, src string }{
		{"203.0.113.9", "10.0.0.0/8"},
		{"203.0.113.9", "192.168.100.2/32"},
		{"203.0.113.9", "0.0.0.0/0"},
		{"2001:db8::9", "fd00:100::/64"},
		{"2001:db8::9", "fd00:100::2/128"},
	} {
		vip := VIP{Addr: netip.MustParseAddr(tc.vip), Port: 443, Proto: dataplane.TCP}
		p := netip.MustParsePrefix(tc.src)
		k := srcRangeKey(vip, p)
		want := uint32(srcRangeFrontendBits + p.Bits())
		if p.Addr().Is4() {
			want += 96 // v4-mapped, as the programs look it up
		}
		if k.Prefixlen != want {
			t.Errorf("%s of %s: prefixlen %d, want %d", p, vip, k.Prefixlen, want)
		}
		gotVIP, gotP, ok := srcRangeFromBPF(k)
		if !ok || gotVIP != vip || gotP != p {
			t.Errorf("%s of %s read back as %s of %s (%v)", p, vip, gotP, gotVIP, ok)
		}
	}
}

func TestSourceRangesAreWrittenTrimmedAndAdopted(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	s := lb.SourceRanges()
	a, b, c := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("172.16.0.0/12")
	fenced := lbService(b, a)
	if err := lb.Upsert(fenced); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(fenced.VIP); !slices.Equal(got, []netip.Prefix{a, b}) {
		t.Errorf("after the first write: %v", got)
	}
	// Changed ranges replace the old ones.
	fenced.SourceRanges = []netip.Prefix{c}
	if lb.Matches(fenced) {
		t.Error("Matches ignores a change of the ranges alone")
	}
	if err := lb.Upsert(fenced); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(fenced.VIP); !slices.Equal(got, []netip.Prefix{c}) {
		t.Errorf("after the change: %v, want [%s]", got, c)
	}
	if u := s.Usage(); u.Entries != 1 {
		t.Errorf("usage %+v, want 1 entry", u)
	}
	// A restarted kpr adopts what the map holds.
	again := lb.ReopenInMemory(false)
	if got := again.SourceRanges().Get(fenced.VIP); !slices.Equal(got, []netip.Prefix{c}) {
		t.Errorf("adopted %v, want [%s]", got, c)
	}
	if got, _ := again.Get(fenced.VIPKey); !slices.Equal(got.SourceRanges, []netip.Prefix{c}) {
		t.Errorf("the adopted master asks for %v, want [%s]", got.SourceRanges, c)
	}
	if in, err := lb.InSync(); err != nil || !in {
		t.Errorf("InSync = %v, %v; want true", in, err)
	}
	if err := again.Delete(fenced.VIPKey); err != nil {
		t.Fatal(err)
	}
	if got := again.SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("a deleted frontend left ranges for %v", got)
	}
	if in, _ := lb.InSync(); in {
		t.Error("InSync missed source ranges deleted behind the LB's back")
	}
	fenced.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}
	if err := lb.Upsert(fenced); err == nil {
		t.Error("an IPv6 range of an IPv4 frontend was accepted")
	}
}

// lbService is a LoadBalancer frontend with one backend and ranges.
func lbService(ranges ...netip.Prefix) Service {
	return Service{VIPKey: VIPKey{VIP: VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}},
		Kind: dataplane.LoadBalancer, Backends: []dataplane.Backend{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080}},
		SourceRanges: ranges}
}

// Ranges no master asks for, as a kpr that stopped mid-change leaves
// them, go when the maps are adopted.
func TestUnaskedSourceRangesAreRemoved(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	vip := VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}
	if err := lb.SourceRanges().add(vip, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); err != nil {
		t.Fatal(err)
	}
	if got := lb.ReopenInMemory(false).SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("adopting the maps kept unasked ranges of %v", got)
	}
}

func TestSourceRangesFullIsRefused(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	lb.ranges.t = newMemTable[bpf.KprSrcRangeKey, uint8](2)
	vip := VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}
	err := lb.SourceRanges().add(vip, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16")})
	if !errors.Is(err, ErrMapFull) {
		t.Fatalf("Add beyond the map's size: %v, want ErrMapFull", err)
	}
	if got := lb.SourceRanges().Get(vip); len(got) != 0 {
		t.Errorf("a refused Add left %v", got)
	}
}

// The master carries the flag, and a change of it alone is a change.
func TestSourceRangesFlagIsWrittenAndCompared(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	svc := lbService(netip.MustParsePrefix("10.0.0.0/8"))
	if err := lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	if got, _ := lb.ReopenInMemory(true).Get(svc.VIPKey); len(got.SourceRanges) == 0 {
		t.Error("the master entry does not carry SVC_F_SOURCE_RANGES")
	}
	open := svc
	open.SourceRanges = nil
	if lb.Matches(open) {
		t.Error("Matches ignores the source-range flag")
	}
	if err := lb.Upsert(open); err != nil {
		t.Fatal(err)
	}
	if got, _ := lb.ReopenInMemory(true).Get(svc.VIPKey); len(got.SourceRanges) != 0 {
		t.Error("clearing the flag left it in the map")
	}
	if got := lb.SourceRanges().VIPs(); len(got) != 0 {
		t.Errorf("clearing the flag left the ranges of %v", got)
	}
}

// rangeMaps are fake maps whose every write checks that no master asks
// for source ranges the map lacks: the order write.go promises.
type rangeMaps struct {
	*fakeMaps
	ranges *memTable[bpf.KprSrcRangeKey, uint8]
	// admitted are, per frontend, the ranges both the state before and
	// the state after the change in flight admit: a master that asks for
	// ranges must find every one of them, and at least one range.
	admitted map[VIP][]netip.Prefix
}

func newRangeMaps(t *testing.T) *rangeMaps {
	f := &rangeMaps{fakeMaps: newFakeMaps(t, 100, 100, 100), ranges: newMemTable[bpf.KprSrcRangeKey, uint8](64)}
	check := func() { f.checkLookupSafe(); f.checkRanges() }
	f.services.check, f.backends.check, f.revNat.check, f.ranges.check = check, check, check, check
	return f
}

func (f *rangeMaps) lb() *LB {
	f.t.Helper()
	lb, err := newLB(tables{f.services, f.backends, f.revNat, f.affinityMatch}, f.ranges, false)
	if err != nil {
		f.t.Fatal(err)
	}
	return lb
}

func (f *rangeMaps) checkRanges() {
	f.t.Helper()
	held := map[VIP][]netip.Prefix{}
	for k := range f.ranges.data {
		vip, p, _ := srcRangeFromBPF(k)
		held[vip] = append(held[vip], p)
	}
	for k, v := range f.services.data {
		if k.Slot != 0 || v.Flags&svcFlagSourceRanges == 0 {
			continue
		}
		vip := vipKeyFromBPF(k).VIP
		if len(held[vip]) == 0 {
			f.t.Fatalf("master %s asks for source ranges, and the map has none: every client is dropped", vip)
		}
		for _, p := range f.admitted[vip] {
			if !slices.Contains(held[vip], p) {
				f.t.Fatalf("master %s asks for source ranges, and the map lacks %s, admitted before and after", vip, p)
			}
		}
	}
}

// change sets what the change in flight must keep admitting.
func (f *rangeMaps) change(vip VIP, before, after []netip.Prefix) {
	f.admitted = map[VIP][]netip.Prefix{}
	for _, p := range before {
		if slices.Contains(after, p) {
			f.admitted[vip] = append(f.admitted[vip], p)
		}
	}
}

func TestSourceRangesAreWrittenInLookupSafeOrder(t *testing.T) {
	a, b, c := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")
	f := newRangeMaps(t)
	lb := f.lb()
	internal := lbService(a, b)
	external := internal
	external.Scope = ScopeExternal
	steps := []struct {
		desc   string
		after  []netip.Prefix
		delete bool
	}{
		{desc: "new frontend with ranges", after: []netip.Prefix{a, b}},
		{desc: "ranges replaced", after: []netip.Prefix{c}},
		{desc: "ranges grown and shrunk", after: []netip.Prefix{a, c}},
		{desc: "ranges dropped", after: nil},
		{desc: "ranges again", after: []netip.Prefix{b}},
		{desc: "deleted", delete: true},
	}
	var before []netip.Prefix
	for _, s := range steps {
		f.change(internal.VIP, before, s.after)
		var err error
		if s.delete {
			err = lb.Delete(internal.VIPKey, external.VIPKey)
		} else {
			internal.SourceRanges, external.SourceRanges = s.after, s.after
			err = lb.Upsert(internal, external)
		}
		if err != nil {
			t.Fatalf("%s: %v", s.desc, err)
		}
		got := lb.SourceRanges().Get(internal.VIP)
		want := slices.Clone(s.after)
		slices.SortFunc(want, comparePrefixes)
		if s.delete {
			want = nil
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: the map holds %v, want %v", s.desc, got, want)
		}
		before = s.after
	}
}

// A change that fails is undone in the same order: the ranges go only
// after the masters that asked for them are back to the old state.
func TestFailedWriteRestoresSourceRanges(t *testing.T) {
	a, c := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")
	for failAt := 1; failAt <= 12; failAt++ {
		t.Run(fmt.Sprint("fail at write ", failAt), func(t *testing.T) {
			f := newRangeMaps(t)
			lb := f.lb()
			old := lbService(a)
			if err := lb.Upsert(old); err != nil {
				t.Fatal(err)
			}
			injected := errors.New("injected write failure")
			for _, tb := range append(f.writable(), f.ranges) {
				tb.setFail(failAt, injected)
			}
			next := lbService(c)
			next.Backends = append(next.Backends, dataplane.Backend{Addr: netip.MustParseAddr("10.244.0.6"), Port: 8080})
			f.change(old.VIP, old.SourceRanges, next.SourceRanges)
			err := lb.Upsert(next)
			for _, tb := range append(f.writable(), f.ranges) {
				tb.setFail(0, nil)
			}
			want := next.SourceRanges
			if err != nil {
				if !errors.Is(err, injected) {
					t.Fatalf("error lost its cause: %v", err)
				}
				want = old.SourceRanges
			}
			if got := lb.SourceRanges().Get(old.VIP); !slices.Equal(got, want) {
				t.Errorf("after %v the map holds %v, want %v", err, got, want)
			}
			if in, err := lb.InSync(); err != nil || !in {
				t.Errorf("InSync = %v, %v after %v", in, err, err)
			}
		})
	}
}
