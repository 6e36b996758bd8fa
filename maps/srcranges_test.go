package maps

import (
	"errors"
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

func TestSourceRangesAddTrimAndAdopt(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	s := lb.SourceRanges()
	vip := VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}
	a, b, c := netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("172.16.0.0/12")
	if err := s.Add(vip, []netip.Prefix{b, a}); err != nil {
		t.Fatal(err)
	}
	// Adding keeps what is there: the old ranges stay until Trim.
	if err := s.Add(vip, []netip.Prefix{c}); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(vip); !slices.Equal(got, []netip.Prefix{a, c, b}) {
		t.Errorf("after Add: %v", got)
	}
	if err := s.Trim(vip, []netip.Prefix{c}); err != nil {
		t.Fatal(err)
	}
	if got := s.Get(vip); !slices.Equal(got, []netip.Prefix{c}) {
		t.Errorf("after Trim: %v, want [%s]", got, c)
	}
	if u := s.Usage(); u.Entries != 1 {
		t.Errorf("usage %+v, want 1 entry", u)
	}
	// A restarted kpr adopts what the map holds.
	again := lb.ReopenInMemory(false).SourceRanges()
	if got := again.Get(vip); !slices.Equal(got, []netip.Prefix{c}) {
		t.Errorf("adopted %v, want [%s]", got, c)
	}
	if in, err := lb.InSync(); err != nil || !in {
		t.Errorf("InSync = %v, %v; want true", in, err)
	}
	if err := again.Trim(vip, nil); err != nil {
		t.Fatal(err)
	}
	if in, _ := lb.InSync(); in {
		t.Error("InSync missed source ranges deleted behind the LB's back")
	}
	if err := s.Add(vip, []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}); err == nil {
		t.Error("an IPv6 range of an IPv4 frontend was accepted")
	}
}

func TestSourceRangesFullIsRefused(t *testing.T) {
	lb := NewInMemory(64, 64, 64)
	lb.ranges.t = newMemTable[bpf.KprSrcRangeKey, uint8](2)
	vip := VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}
	err := lb.SourceRanges().Add(vip, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"),
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
	svc := Service{VIPKey: VIPKey{VIP: VIP{Addr: netip.MustParseAddr("203.0.113.9"), Port: 80, Proto: dataplane.TCP}},
		Kind: dataplane.LoadBalancer, Backends: []dataplane.Backend{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 8080}},
		SourceRanges: true}
	if err := lb.Upsert(svc); err != nil {
		t.Fatal(err)
	}
	if got, _ := lb.ReopenInMemory(true).Get(svc.VIPKey); !got.SourceRanges {
		t.Error("the master entry does not carry SVC_F_SOURCE_RANGES")
	}
	open := svc
	open.SourceRanges = false
	if lb.Matches(open) {
		t.Error("Matches ignores the source-range flag")
	}
	if err := lb.Upsert(open); err != nil {
		t.Fatal(err)
	}
	if got, _ := lb.ReopenInMemory(true).Get(svc.VIPKey); got.SourceRanges {
		t.Error("clearing the flag left it in the map")
	}
}
