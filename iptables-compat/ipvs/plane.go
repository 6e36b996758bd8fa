package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

// DefaultScheduler is kube-proxy's default --ipvs-scheduler.
const DefaultScheduler = "rr"

// Options configure a Plane.
type Options struct {
	// Kernel reaches IPVS, the dummy interface and the ipsets; required.
	Kernel Kernel
	// Runner runs the iptables binaries; required.
	Runner netfilter.Runner
	// Families maps each family the Plane programs to its iptables
	// binaries; IPv4 is required. Without IPv6 the IPv6 frontends are not
	// served.
	Families map[netfilter.Family]netfilter.Tools
	// Scheduler is the IPVS scheduler of every virtual server; empty is
	// DefaultScheduler.
	Scheduler string
	// Masquerade is kube-proxy's --masquerade-all and --detect-local-mode:
	// with All every connection to a ClusterIP is masqueraded, else those
	// not from this node's pods, as kube-proxy's IPVS mode does. The node's
	// own connections are masqueraded either way.
	Masquerade netfilter.Masquerade
	// Conntrack deletes the UDP conntrack entries that no longer match
	// the virtual servers (see netfilter.UDPConntrack); nil skips it.
	Conntrack netfilter.ConntrackCleaner
	// Limits are the ipsets' sizes and the firewall marks; the zero
	// value is what the kernel and kube-proxy have (refusals.go).
	Limits Limits
	// ExcludeCIDRs are kube-proxy's --ipvs-exclude-cidrs: a virtual
	// server or an address on the dummy interface inside one is never
	// deleted, even when no Service wants it any more, so that what
	// another program put there survives kpr's clean-up of its own.
	ExcludeCIDRs []netip.Prefix
	Log          *zap.Logger
}

// Plane is the IPVS dataplane.Dataplane.
type Plane struct {
	k         Kernel
	run       netfilter.Runner
	tools     map[netfilter.Family]netfilter.Tools
	families  []netfilter.Family
	scheduler string
	masq      netfilter.Masquerade
	conntrack *netfilter.UDPConntrack
	exclude   []netip.Prefix
	log       *zap.Logger

	// mu keeps the reaper out of a call in progress.
	mu sync.Mutex
	// cur is what the kernel holds of the Plane's state as far as the
	// Plane knows: read at the first call and at every Reconcile, kept up
	// to date by every write since. Nil before the first call.
	cur     *kstate
	sps     map[dataplane.ServicePortName]*dataplane.ServicePort
	contrib map[dataplane.ServicePortName]*contribution
	marks   *marks
	// reconciled is set by a successful Reconcile and cleared by a failed
	// call: until then no drift check vouches for the kernel.
	reconciled bool
	limits     Limits
	// refused are the ServicePorts that would overfill a bounded table,
	// with their latest desired state: the kernel keeps what it held for
	// them (sps and contrib still say what), and every call that frees
	// room, and every Reconcile, tries them again. refusedMu guards it
	// for Refused, which any goroutine may call.
	refusedMu sync.Mutex
	refused   map[dataplane.ServicePortName]refusal
}

var _ dataplane.Dataplane = (*Plane)(nil)

// New returns a Plane; it reads and writes nothing until the first call.
func New(o Options) (*Plane, error) {
	if o.Kernel == nil || o.Runner == nil {
		return nil, errors.New("ipvs.New: Options need a Kernel and a Runner")
	}
	if _, ok := o.Families[netfilter.IPv4]; !ok {
		return nil, errors.New("ipvs.New: Options need the IPv4 iptables Tools")
	}
	p := &Plane{k: o.Kernel, run: o.Runner, tools: o.Families, scheduler: o.Scheduler, masq: o.Masquerade,
		exclude: o.ExcludeCIDRs, log: o.Log, limits: o.Limits,
		sps: map[dataplane.ServicePortName]*dataplane.ServicePort{}, contrib: map[dataplane.ServicePortName]*contribution{},
		marks: newMarks(o.Limits.marks()), refused: map[dataplane.ServicePortName]refusal{}}
	if p.scheduler == "" {
		p.scheduler = DefaultScheduler
	}
	if p.log == nil {
		p.log = zap.NewNop()
	}
	p.families = netfilter.FamiliesOf(o.Families)
	p.conntrack = netfilter.NewUDPConntrack(o.Conntrack, p.families, p.log)
	return p, nil
}

// excluded reports whether a is in one of the ExcludeCIDRs (a firewall
// mark's virtual server has no address, and is never excluded).
func (p *Plane) excluded(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, c := range p.exclude {
		if c.Contains(a.Unmap()) {
			return true
		}
	}
	return false
}

func (p *Plane) ipv6() bool { _, ok := p.tools[netfilter.IPv6]; return ok }

// Apply writes the virtual servers, addresses and set members of the
// changed ServicePorts, and the nat rules if their marks changed. A
// ServicePort that would overfill a set or lacks a firewall mark is
// refused alone (see Refused); the others are written.
func (p *Plane) Apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.room()
	err := p.apply(changes)
	if err == nil && len(p.refused) > 0 && p.room().freed(before) {
		err = p.apply(p.refusedChanges())
	}
	return err
}

func (p *Plane) apply(changes map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	// saved is set by the first call, which also writes the rules whole.
	var saved map[netfilter.Family]map[string]*netfilter.SavedTable
	if p.cur == nil {
		// A restarted kpr goes on from what the kernel holds.
		if err := p.setup(); err != nil {
			return err
		}
		cur, s, err := p.read()
		if err != nil {
			return err
		}
		p.cur, saved = cur, s
		p.adoptMarks()
	}
	next := maps.Clone(p.contrib)
	nextSPs := maps.Clone(p.sps)
	tc := newTouched()
	var changed, upserts []dataplane.ServicePortName
	for n, sp := range changes {
		if sp == p.sps[n] || (sp == nil && p.sps[n] == nil) {
			continue // unchanged, or deleting what was never written
		}
		changed = append(changed, n)
		tc.add(p.contrib[n])
		if sp == nil {
			delete(next, n)
			delete(nextSPs, n)
		} else {
			upserts = append(upserts, n)
		}
	}
	refused, err := p.admit(next, nextSPs, upserts, changes, tc)
	if err != nil {
		return err
	}
	if len(changed) > 0 || saved != nil {
		if err := p.write(next, nextSPs, changed, tc, saved); err != nil {
			return err
		}
	}
	p.settleRefusals(func(n dataplane.ServicePortName) bool { _, ok := changes[n]; return ok }, refused)
	return nil
}

// admit works out, in name order, the contributions of the ServicePorts
// upserts names (their new states in sps) and puts each that fits the
// bounded tables into next and nextSPs, which hold what stays as it is;
// tc, when not nil, learns what they touch. The others keep what next
// holds for them (their old contribution, or none) and are returned as
// refused. An error is one no ServicePort can be refused for.
func (p *Plane) admit(next map[dataplane.ServicePortName]*contribution, nextSPs map[dataplane.ServicePortName]*dataplane.ServicePort,
	upserts []dataplane.ServicePortName, sps map[dataplane.ServicePortName]*dataplane.ServicePort, tc *touched) (map[dataplane.ServicePortName]refusal, error) {
	refused := map[dataplane.ServicePortName]refusal{}
	if len(upserts) == 0 {
		return refused, nil
	}
	slices.SortFunc(upserts, dataplane.ServicePortName.Compare)
	marks := p.marks.clone()
	adm := newAdmission(p.limits, p.cur, next)
	for _, n := range upserts {
		sp := sps[n]
		alloc, undo := marks.tracking()
		c, err := desire(sp, p.scheduler, p.ipv6(), alloc)
		if err == nil {
			err = adm.admit(next[n], c)
		} else if !errors.Is(err, errNoMark) {
			return nil, err
		}
		if err != nil {
			undo()
			refused[n] = refusal{sp: sp, msg: refusalMessage(n, err, next[n] != nil)}
			continue
		}
		next[n], nextSPs[n] = c, sp
		if tc != nil {
			tc.add(c)
		}
	}
	return refused, nil
}

// Reconcile reads the kernel and makes it hold exactly all: it repairs
// what changed behind the Plane's back and removes the virtual servers,
// addresses and set members of kpr's that no ServicePort wants. Refused
// ServicePorts are tried again.
func (p *Plane) Reconcile(all map[dataplane.ServicePortName]*dataplane.ServicePort) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reconciled = false
	if err := p.setup(); err != nil {
		return err
	}
	cur, saved, err := p.read()
	if err != nil {
		return err
	}
	p.cur = cur
	p.adoptMarks()
	// What is unchanged stays; what changed (or is refused) is admitted
	// anew, keeping meanwhile what the kernel has of it.
	next := map[dataplane.ServicePortName]*contribution{}
	nextSPs := map[dataplane.ServicePortName]*dataplane.ServicePort{}
	var changed, upserts []dataplane.ServicePortName
	for n, sp := range all {
		if sp == nil {
			continue
		}
		changed = append(changed, n)
		if c := p.contrib[n]; c != nil {
			next[n], nextSPs[n] = c, p.sps[n]
			if p.sps[n] == sp {
				continue
			}
		}
		upserts = append(upserts, n)
	}
	for n := range p.sps {
		if all[n] == nil {
			changed = append(changed, n)
		}
	}
	refused, err := p.admit(next, nextSPs, upserts, all, nil)
	if err != nil {
		return err
	}
	if err := p.write(next, nextSPs, changed, nil, saved); err != nil {
		return err
	}
	p.settleRefusals(func(dataplane.ServicePortName) bool { return true }, refused)
	p.reconciled = true
	return nil
}

// adoptMarks takes the marks the kernel's rules hold for frontends that
// no ServicePort of this Plane has yet, so that a restarted kpr keeps
// them.
func (p *Plane) adoptMarks() {
	for k, m := range p.cur.internal {
		if _, ok := p.marks.byKey[k]; ok {
			continue
		}
		if _, taken := p.marks.byMark[m]; !taken && ownMark(m) {
			p.marks.set(k, m)
		}
	}
}

// setup creates the dummy interface and the sets if they are missing.
func (p *Plane) setup() error {
	if err := p.k.EnsureDevice(); err != nil {
		return fmt.Errorf("create the dummy interface %s for the virtual addresses: %w", DeviceName, err)
	}
	for _, s := range setSpecs() {
		if s.IPv6 && !p.ipv6() {
			continue
		}
		s.MaxElem = p.limits.setSize(s.Name)
		if err := p.k.EnsureSet(s); err != nil {
			return fmt.Errorf("create ipset %s (%s): %w", s.Name, s.Type, err)
		}
	}
	return nil
}

// write brings the kernel from p.cur to the union of next, looking only
// at the parts tc names (all of them when tc is nil, for a Reconcile).
// With saved, the tables as just read, it rewrites the iptables rules
// whole, inserting the jumps saved lacks. When a write fails, the ones before it are undone, so that
// every ServicePort is left as it was.
func (p *Plane) write(next map[dataplane.ServicePortName]*contribution, nextSPs map[dataplane.ServicePortName]*dataplane.ServicePort,
	changed []dataplane.ServicePortName, tc *touched, saved map[netfilter.Family]map[string]*netfilter.SavedTable) error {
	w := want(next)
	full := tc == nil
	if full {
		tc = everything(p.cur, w)
	}
	pl := p.plan(w, tc)
	for _, fam := range p.families {
		p.planRules(pl, fam, w, saved[fam], saved != nil)
	}
	pl.finish()
	if err := pl.run(); err != nil {
		p.reconciled = false
		return err
	}

	oldSPs := p.sps
	p.cur, p.contrib, p.sps = pl.after, next, nextSPs
	p.marks = newMarks(p.limits.marks())
	for k, m := range w.internal {
		p.marks.set(k, m)
	}
	p.conntrack.Synced(oldSPs, nextSPs, changed, full)
	return nil
}

// op is one write and the write that undoes it.
type op struct {
	do, undo func() error
}

// plan is the writes of one call, in order, and the tables as they will
// be after them.
type plan struct {
	ops    []op
	after  *kstate
	finish func()
}

func (pl *plan) add(do, undo func() error) { pl.ops = append(pl.ops, op{do, undo}) }

func (pl *plan) run() error {
	for i, o := range pl.ops {
		if err := o.do(); err != nil {
			for j := i - 1; j >= 0; j-- {
				if pl.ops[j].undo == nil {
					continue
				}
				if uerr := pl.ops[j].undo(); uerr != nil {
					err = errors.Join(err, fmt.Errorf("undo an earlier write of the same call (the kernel now holds a mix of old and new; the next Reconcile repairs it): %w", uerr))
				}
			}
			return err
		}
	}
	return nil
}

// plan orders the writes so that new state serves before old state goes:
// virtual servers and their real servers, set members, addresses; then,
// after the nat rules (planRules), unbinding, virtual server deletes and
// set member deletes (finish).
func (p *Plane) plan(w *kstate, tc *touched) *plan {
	pl := &plan{after: p.cur.clone()}
	after := pl.after
	keys := sortedKeys(tc.services)
	var deletes []ServiceKey
	for _, k := range keys {
		have, want := p.cur.services[k], w.services[k]
		switch {
		case want == nil && have == nil:
		case want == nil && p.excluded(k.Addr):
			// Left in place, and in after, as kube-proxy leaves it.
		case want == nil:
			deletes = append(deletes, k)
		case have == nil:
			p.addService(pl, want)
			after.services[k] = want.clone()
		default:
			p.updateService(pl, have, want, p.udp(k, w))
		}
	}
	entries := sortedEntries(tc.entries)
	for _, e := range entries {
		if w.entries[e] && !p.cur.entries[e] {
			pl.add(func() error { return wrap(p.k.AddEntry(e.set, e.entry), "add %s to ipset %s", e.entry, e.set) },
				func() error { return p.k.DelEntry(e.set, e.entry) })
			after.entries[e] = true
		}
	}
	addrs := sortedAddrs(tc.bound)
	for _, a := range addrs {
		if w.bound[a] && !p.cur.bound[a] {
			pl.add(func() error { return wrap(p.k.AddAddr(a), "bind %s to %s", a, DeviceName) },
				func() error { return p.k.DelAddr(a) })
			after.bound[a] = true
		}
	}
	pl.finish = func() {
		for _, a := range addrs {
			if !w.bound[a] && p.cur.bound[a] && !p.excluded(a) {
				pl.add(func() error { return wrap(p.k.DelAddr(a), "unbind %s from %s", a, DeviceName) },
					func() error { return p.k.AddAddr(a) })
				delete(after.bound, a)
			}
		}
		for _, k := range deletes {
			have := p.cur.services[k]
			pl.add(func() error { return wrap(p.k.DelService(k), "delete virtual server %s", k) },
				func() error { return p.restoreService(have) })
			delete(after.services, k)
		}
		for _, e := range entries {
			if !w.entries[e] && p.cur.entries[e] {
				pl.add(func() error { return wrap(p.k.DelEntry(e.set, e.entry), "delete %s from ipset %s", e.entry, e.set) },
					func() error { return p.k.AddEntry(e.set, e.entry) })
				delete(after.entries, e)
			}
		}
	}
	return pl
}
