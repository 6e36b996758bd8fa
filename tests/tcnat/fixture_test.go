// Package tcnat tests kpr's packet-level translation at tc (bpf/tc_nodeport.c)
// for traffic from other machines: the programs run on hand-built packets
// through BPF_PROG_TEST_RUN, and in a namespace topology with an external
// client, a node and backend pods.
package tcnat

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/loader"
	"github.com/kpr-io/kpr/maps"
	"github.com/kpr-io/kpr/tests/harness"
)

// The tc verdicts the tests expect (linux/pkt_cls.h).
const (
	actUnspec = 0xffffffff // TC_ACT_UNSPEC: passed on (-1 as an unsigned return value)
	actShot   = 2          // TC_ACT_SHOT: dropped
)

// progs is a loaded dataplane whose tc programs are run on test packets.
type progs struct {
	t       testing.TB
	loaded  *loader.Loaded
	lb      *maps.LB
	ingress *ebpf.Program
	egress  *ebpf.Program
}

// newProgs loads kpr's maps and tc programs under a private BPF root,
// without attaching the tc programs anywhere.
func newProgs(t testing.TB, timeouts loader.ConntrackTimeouts) *progs {
	t.Helper()
	return newProgsSized(t, timeouts, fixtureSizes)
}

// newProgsSized is newProgs with the maps sized as kpr run's --map-size-*
// flags size them.
func newProgsSized(t testing.TB, timeouts loader.ConntrackTimeouts, sizes loader.MapSizes) *progs {
	t.Helper()
	loaded := loadDataplaneSized(t, newBPFRoot(t), &loader.TCOptions{Timeouts: timeouts}, sizes)
	lb, err := maps.New(loaded.Maps)
	if err != nil {
		t.Fatal(err)
	}
	return &progs{t: t, loaded: loaded, lb: lb, ingress: loaded.TC.Ingress, egress: loaded.TC.Egress}
}

// newBPFRoot names a private BPF root, removed with everything under it
// when the test ends (after the dataplanes loaded later are closed).
func newBPFRoot(t testing.TB) string {
	t.Helper()
	harness.RequireRoot(t)
	bpfRoot := "/sys/fs/bpf/kpr-test-" + randomHex(6)
	t.Cleanup(func() {
		if err := loader.Cleanup(bpfRoot); err != nil {
			t.Errorf("cleanup of %s: %v", bpfRoot, err)
		}
	})
	return bpfRoot
}

// loadDataplane loads (or adopts, the second time) kpr's dataplane under
// bpfRoot, its socket hooks on a cgroup of the test's that holds no
// process, and the tc programs if tc is set.
func loadDataplane(t testing.TB, bpfRoot string, tc *loader.TCOptions) *loader.Loaded {
	t.Helper()
	return loadDataplaneSized(t, bpfRoot, tc, fixtureSizes)
}

// fixtureSizes keeps the tests' conntrack map small.
var fixtureSizes = loader.MapSizes{Conntrack: 4096}

// loadDataplaneSized is loadDataplane with the maps sized as given (zero
// keeps a map's compiled-in size).
func loadDataplaneSized(t testing.TB, bpfRoot string, tc *loader.TCOptions, sizes loader.MapSizes) *loader.Loaded {
	t.Helper()
	cg, err := harness.NewCgroup(t)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := loader.Load(loader.Options{BPFRoot: bpfRoot, CgroupRoot: cg.Path, Sizes: sizes, TC: tc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loaded.Close() })
	return loaded
}

// run runs prog on frame and returns its verdict and the packet it left.
func run(t testing.TB, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// in runs the ingress program on f and returns the verdict and the packet.
func (p *progs) in(f flow) (uint32, parsed) {
	p.t.Helper()
	ret, out := run(p.t, p.ingress, build(p.t, f))
	return ret, parse(p.t, out)
}

// out runs the egress program on f.
func (p *progs) out(f flow) (uint32, parsed) {
	p.t.Helper()
	ret, out := run(p.t, p.egress, build(p.t, f))
	return ret, parse(p.t, out)
}

// upsert writes one frontend with the given backends.
func (p *progs) upsert(kind dataplane.FrontendKind, scope maps.Scope, fe netip.AddrPort, proto dataplane.Protocol, backends ...netip.AddrPort) {
	p.t.Helper()
	svc := maps.Service{VIPKey: maps.VIPKey{VIP: maps.VIP{Addr: fe.Addr(), Port: fe.Port(), Proto: proto}, Scope: scope}, Kind: kind}
	for _, b := range backends {
		svc.Backends = append(svc.Backends, dataplane.Backend{Addr: b.Addr(), Port: b.Port()})
	}
	if err := p.lb.Upsert(svc); err != nil {
		p.t.Fatal(err)
	}
}

// stats sums the per-CPU counters.
func (p *progs) stats() bpf.KprNatStats {
	p.t.Helper()
	sum, err := maps.TCStats(p.loaded.Maps.KprTcStats)
	if err != nil {
		p.t.Fatal(err)
	}
	return sum
}

// ctMaps are the programs' two conntrack maps: the flows that showed
// traffic both ways, and the others.
func (p *progs) ctMaps() []*ebpf.Map {
	return []*ebpf.Map{p.loaded.Maps.KprConntrack, p.loaded.Maps.KprCtNew}
}

// ctLookup reads the conntrack entry under key, from whichever map has it.
func (p *progs) ctLookup(key *bpf.KprCtKey, v *bpf.KprCtValue) error {
	var err error
	for _, m := range p.ctMaps() {
		if err = m.Lookup(key, v); err == nil {
			return nil
		}
	}
	return err
}

// flows lists the conntrack maps' flows.
func (p *progs) flows() []maps.ConntrackFlow {
	p.t.Helper()
	flows, err := maps.ConntrackFlows(p.ctMaps()...)
	if err != nil {
		p.t.Fatal(err)
	}
	return flows
}

// forwardEntry reads the conntrack entry of f (as the client sent it).
func (p *progs) forwardEntry(f flow) (bpf.KprCtValue, bool) {
	p.t.Helper()
	key := bpf.KprCtKey{Sport: htons(f.src.Port()), Dport: htons(f.dst.Port()), Proto: uint8(f.proto)}
	key.Saddr = addr16(f.src.Addr())
	key.Daddr = addr16(f.dst.Addr())
	var v bpf.KprCtValue
	err := p.ctLookup(&key, &v)
	return v, err == nil
}

// flushConntrack empties the conntrack maps.
func (p *progs) flushConntrack() {
	p.t.Helper()
	for _, m := range p.ctMaps() {
		var k bpf.KprCtKey
		var keys []bpf.KprCtKey
		it := m.Iterate()
		var v bpf.KprCtValue
		for it.Next(&k, &v) {
			keys = append(keys, k)
		}
		for _, k := range keys {
			if err := m.Delete(&k); err != nil {
				p.t.Fatal(err)
			}
		}
	}
}

// addr16 is an address as the maps hold it: 16 bytes, IPv4 v4-mapped
// (As16's form), as four words read in host order.
func addr16(a netip.Addr) [4]uint32 {
	b := a.As16()
	var out [4]uint32
	for i := range out {
		out[i] = binary.NativeEndian.Uint32(b[i*4:])
	}
	return out
}

func htons(v uint16) uint16 { return v>>8 | v<<8 }

func monotonicNow(t testing.TB) uint64 {
	now, err := monotonic()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func samePayload(t testing.TB, got []byte) {
	t.Helper()
	if !bytes.Equal(got, payload) {
		t.Errorf("payload changed: %q", got)
	}
}
