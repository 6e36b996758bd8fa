package dataplane

import (
	"math"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"
)

// The name order goes field by field: a namespace that another begins
// with comes first (String() order put "kube-system" before "kube", as '-'
// sorts before '/'), and protocols go by number.
func TestServicePortNameOrder(t *testing.T) {
	want := []ServicePortName{
		{Namespace: "kube", Name: "dns", Protocol: TCP},
		{Namespace: "kube", Name: "dns-tcp", Protocol: TCP},
		{Namespace: "kube-system", Name: "dns", Protocol: TCP},
		{Namespace: "kube-system", Name: "dns", Protocol: UDP},
		{Namespace: "kube-system", Name: "dns", Protocol: SCTP},
		{Namespace: "kube-system", Name: "dns", Port: "a", Protocol: TCP},
		{Namespace: "kube-system", Name: "dns", Port: "a-b", Protocol: TCP},
		{Namespace: "kube-system", Name: "dns", Port: "b", Protocol: TCP},
	}
	for i := range want {
		for j := range want {
			if got := want[i].Compare(want[j]); sign(got) != sign(i-j) {
				t.Errorf("%s.Compare(%s) = %d, want the sign of %d", want[i], want[j], got, i-j)
			}
		}
	}
	got := slices.Clone(want)
	slices.Reverse(got)
	slices.SortFunc(got, ServicePortName.Compare)
	if !slices.Equal(got, want) {
		t.Errorf("sorted: %v, want %v", got, want)
	}
}

func TestBackendOrder(t *testing.T) {
	want := []Backend{
		{Addr: netip.MustParseAddr("10.0.0.2"), Port: 80},
		{Addr: netip.MustParseAddr("10.0.0.2"), Port: 8080},
		{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80},
		{Addr: netip.MustParseAddr("fd00::1"), Port: 80},
	}
	for i := range want {
		for j := range want {
			if got := want[i].Compare(want[j]); sign(got) != sign(i-j) {
				t.Errorf("%s.Compare(%s) = %d, want the sign of %d", want[i], want[j], got, i-j)
			}
		}
	}
}

func sign(n int) int { return min(max(n, -1), 1) }

// Sorting runs on every full sync over every ServicePort and backend: the
// comparisons must not allocate.
func TestCompareDoesNotAllocate(t *testing.T) {
	a := ServicePortName{Namespace: "shop", Name: "web", Port: "http", Protocol: TCP}
	b := ServicePortName{Namespace: "shop", Name: "web", Port: "https", Protocol: TCP}
	x := Backend{Addr: netip.MustParseAddr("fd00::1"), Port: 80}
	y := Backend{Addr: netip.MustParseAddr("fd00::1"), Port: 443}
	var sink int
	if n := testing.AllocsPerRun(100, func() { sink += a.Compare(b) + x.Compare(y) }); n != 0 {
		t.Errorf("a comparison allocates %v times, want none", n)
	}
	_ = sink
}

func BenchmarkSortServicePortNames(b *testing.B) {
	names := make([]ServicePortName, 10000)
	for i := range names {
		names[i] = ServicePortName{Namespace: "ns-" + strconv.Itoa(i%7), Name: "svc-" + strconv.Itoa(i), Port: "http", Protocol: TCP}
	}
	work := make([]ServicePortName, len(names))
	b.ReportAllocs()
	for b.Loop() {
		copy(work, names)
		slices.SortFunc(work, ServicePortName.Compare)
	}
}

func TestAffinitySeconds(t *testing.T) {
	for _, c := range []struct {
		timeout time.Duration
		want    uint32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Nanosecond, 1},
		{200 * time.Millisecond, 1},
		{time.Second, 1},
		{1500 * time.Millisecond, 2},
		{3 * time.Hour, 10800},
		{3*time.Hour + 1, 10801},
		{time.Duration(math.MaxInt64), math.MaxUint32},
	} {
		if got := AffinitySeconds(c.timeout); got != c.want {
			t.Errorf("AffinitySeconds(%s) = %d, want %d", c.timeout, got, c.want)
		}
	}
}
