package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// srcRangeFrontendBits is SRC_RANGE_FRONTEND_BITS (bpf/types.h): the bits of
// struct src_range_key after prefixlen that name the frontend, matched in
// full before the source range's own bits.
const srcRangeFrontendBits = 160

// SourceRanges holds kpr_src_ranges, the LPM trie the tc programs consult
// for the loadBalancerSourceRanges of a LoadBalancer frontend whose master
// entry asks for them (Service.SourceRanges). Only the LB's write path
// writes it, in the order write.go gives; this type reads it, and keeps
// the view of it that the LB compares with.
type SourceRanges struct {
	t table[bpf.KprSrcRangeKey, uint8]
	// held mirrors the map: the ranges of each frontend, sorted.
	held     map[VIP][]netip.Prefix
	entries  int
	readOnly bool
}

// newSourceRanges returns a writer over t; LB.Resync reads what t holds.
func newSourceRanges(t table[bpf.KprSrcRangeKey, uint8], readOnly bool) (*SourceRanges, error) {
	return &SourceRanges{t: t, readOnly: readOnly, held: map[VIP][]netip.Prefix{}}, nil
}

// Resync rebuilds the view from the map and deletes the entries that are
// no key kpr writes (no lookup of the programs can match them).
func (s *SourceRanges) Resync() error {
	s.held = map[VIP][]netip.Prefix{}
	s.entries = 0
	var junk []bpf.KprSrcRangeKey
	err := s.t.dump(func(k bpf.KprSrcRangeKey, _ uint8) {
		vip, p, ok := srcRangeFromBPF(k)
		if !ok {
			junk = append(junk, k)
			return
		}
		s.held[vip] = append(s.held[vip], p)
		s.entries++
	})
	for vip, ps := range s.held {
		slices.SortFunc(ps, comparePrefixes)
		s.held[vip] = ps
	}
	if err != nil || s.readOnly {
		return err
	}
	return s.t.delete(junk)
}

// inSync reports whether the map holds exactly what the view says.
func (s *SourceRanges) inSync() (bool, error) {
	inSync := true
	n := 0
	err := s.t.dump(func(k bpf.KprSrcRangeKey, _ uint8) {
		n++
		vip, p, ok := srcRangeFromBPF(k)
		if inSync && (!ok || !slices.Contains(s.held[vip], p)) {
			inSync = false
		}
	})
	return err == nil && inSync && n == s.entries, err
}

// Get returns the ranges the map holds for vip, sorted.
func (s *SourceRanges) Get(vip VIP) []netip.Prefix {
	return slices.Clone(s.held[vip.unmapped()])
}

// VIPs returns every frontend the map holds ranges for, sorted.
func (s *SourceRanges) VIPs() []VIP {
	out := make([]VIP, 0, len(s.held))
	for vip := range s.held {
		out = append(out, vip)
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(VIPKey{VIP: out[i]}, VIPKey{VIP: out[j]}) })
	return out
}

// holdsExactly reports whether the map holds ranges for vip and nothing
// else.
func (s *SourceRanges) holdsExactly(vip VIP, ranges []netip.Prefix) bool {
	held := s.held[vip.unmapped()]
	for _, p := range ranges {
		if !slices.Contains(held, p.Masked()) {
			return false
		}
	}
	for _, p := range held {
		if !slices.ContainsFunc(ranges, func(q netip.Prefix) bool { return q.Masked() == p }) {
			return false
		}
	}
	return true
}

// add writes the entries of ranges that the map does not hold for vip yet;
// entries it holds beyond them stay (trim removes those). Every range must
// be of vip's family.
func (s *SourceRanges) add(vip VIP, ranges []netip.Prefix) error {
	if s.readOnly {
		return errReadOnly
	}
	vip = vip.unmapped()
	var keys []bpf.KprSrcRangeKey
	var add []netip.Prefix
	for _, p := range ranges {
		p = p.Masked()
		if p.Addr().Is4() != vip.Addr.Is4() || p.Addr().Zone() != "" {
			return fmt.Errorf("source range %s of %s: not of the frontend's IP family", p, vip)
		}
		if !slices.Contains(s.held[vip], p) && !slices.Contains(add, p) {
			keys = append(keys, srcRangeKey(vip, p))
			add = append(add, p)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if n, max := s.entries+len(keys), s.t.maxEntries(); n > max {
		return fmt.Errorf("%w: the source ranges of %s need %d of %d entries in %s; fewer loadBalancerSourceRanges, or a larger --map-size-src-ranges, make it fit",
			ErrMapFull, vip, n, max, bpf.KprMapKprSrcRanges)
	}
	if err := s.t.put(keys, make([]uint8, len(keys))); err != nil {
		// Some prefix may be in: re-read what is.
		return fmt.Errorf("write source ranges of %s: %w", vip, joinResync(err, s.Resync()))
	}
	s.held[vip] = append(s.held[vip], add...)
	slices.SortFunc(s.held[vip], comparePrefixes)
	s.entries += len(keys)
	return nil
}

// trim deletes the entries the map holds for vip beyond keep (nil: all).
func (s *SourceRanges) trim(vip VIP, keep []netip.Prefix) error {
	if s.readOnly {
		return errReadOnly
	}
	vip = vip.unmapped()
	var keys []bpf.KprSrcRangeKey
	var stay []netip.Prefix
	for _, p := range s.held[vip] {
		if slices.Contains(keep, p) {
			stay = append(stay, p)
		} else {
			keys = append(keys, srcRangeKey(vip, p))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := s.t.delete(keys); err != nil {
		return fmt.Errorf("remove source ranges of %s: %w", vip, joinResync(err, s.Resync()))
	}
	s.entries -= len(keys)
	if len(stay) == 0 {
		delete(s.held, vip)
	} else {
		s.held[vip] = stay
	}
	return nil
}

// RemoveUnaskedRanges deletes the source ranges of every frontend no
// master asks for them: left by a kpr that stopped between writing a
// change and trimming, or by a failed trim. No lookup reaches them.
func (lb *LB) RemoveUnaskedRanges() error {
	if lb.readOnly {
		return errReadOnly
	}
	var errs []error
	for vip := range lb.ranges.held {
		if !lb.othersAskForRanges(vip, nil) {
			errs = append(errs, lb.ranges.trim(vip, nil))
		}
	}
	return errors.Join(errs...)
}

// Usage is the map's fill level.
func (s *SourceRanges) Usage() MapUsage {
	return MapUsage{Map: bpf.KprMapKprSrcRanges, Entries: s.entries, MaxEntries: s.t.maxEntries()}
}

func joinResync(err, resync error) error {
	if resync != nil {
		return fmt.Errorf("%w (and re-reading the map failed: %v)", err, resync)
	}
	return err
}

func (v VIP) unmapped() VIP { v.Addr = v.Addr.Unmap(); return v }

// srcRangeKey is the trie key of range p of frontend vip: IPv4 in its
// v4-mapped form, as every address in the maps.
func srcRangeKey(vip VIP, p netip.Prefix) bpf.KprSrcRangeKey {
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return bpf.KprSrcRangeKey{
		Prefixlen: uint32(srcRangeFrontendBits + bits),
		Frontend:  addrToBPF(vip.Addr),
		Port:      portToBPF(vip.Port),
		Proto:     uint8(vip.Proto),
		Source:    addrToBPF(p.Addr()),
	}
}

func srcRangeFromBPF(k bpf.KprSrcRangeKey) (VIP, netip.Prefix, bool) {
	bits := int(k.Prefixlen) - srcRangeFrontendBits
	if bits < 0 || bits > 128 {
		return VIP{}, netip.Prefix{}, false
	}
	vip := VIP{Addr: addrFromBPF(k.Frontend), Port: portFromBPF(k.Port), Proto: dataplane.Protocol(k.Proto)}
	src := addrFromBPF(k.Source) // unmapped, as addrFromBPF always is
	if src.Is4() {
		if bits < 96 {
			return VIP{}, netip.Prefix{}, false
		}
		bits -= 96
	}
	return vip, netip.PrefixFrom(src, bits), true
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
