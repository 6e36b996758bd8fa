package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/kpr-io/kpr/dataplane"
)

// The kernel tables a tenant's Services can fill. A ServicePort that would
// overfill one is refused alone (dataplane.Refuser), as the eBPF backend
// refuses one that does not fit in its maps: a failed call would fail
// every sync, and with it /healthz and /livez on every node. Virtual
// servers, real servers and the dummy interface's addresses have no limit
// but memory, and the iptables rules are a fixed set but for one per
// firewall mark, so these are all there is:
//
//   - the firewall marks of the frontends whose node-local traffic gets
//     other backends than outside traffic (markIDMask of them);
//   - each ipset, which holds at most its maxelem members.

// DefaultSetSize is the maxelem of the ipsets the Plane creates: ipset's
// default, as kube-proxy's IPVS mode has it.
const DefaultSetSize = 65536

// Limits are the capacities the Plane refuses ServicePorts against. Zero
// values take the defaults; tests make them small.
type Limits struct {
	// SetSizes are the maxelem of the ipsets, by set name; a set not
	// named gets DefaultSetSize. A set that exists already keeps the
	// maxelem it was created with: give the same sizes to every kpr.
	SetSizes map[string]int
	// FirewallMarks is how many firewall marks the Plane hands out, at
	// most (and by default) all markIDMask.
	FirewallMarks int
}

func (l Limits) setSize(name string) int {
	if n, ok := l.SetSizes[name]; ok {
		return n
	}
	return DefaultSetSize
}

func (l Limits) marks() uint32 {
	if l.FirewallMarks <= 0 || l.FirewallMarks > int(markIDMask) {
		return markIDMask
	}
	return uint32(l.FirewallMarks)
}

var _ dataplane.Refuser = (*Plane)(nil)

// Refused returns the ServicePorts that would overfill a set or that lack
// a firewall mark, as of the last Apply or Reconcile.
func (p *Plane) Refused() map[dataplane.ServicePortName]dataplane.Refusal {
	p.refusedMu.Lock()
	defer p.refusedMu.Unlock()
	out := make(map[dataplane.ServicePortName]dataplane.Refusal, len(p.refused))
	for n, r := range p.refused {
		out[n] = dataplane.Refusal{Reason: dataplane.RefusedMapFull, Message: r.msg}
	}
	return out
}

// refusal is one refused ServicePort, with its latest desired state.
type refusal struct {
	sp  *dataplane.ServicePort
	msg string
}

// errNoMark is desire's error when every firewall mark is taken.
var errNoMark = errors.New("no firewall mark left")

// admission decides, one ServicePort at a time in name order (the order
// in which they get room when not all fit), whether a new contribution
// fits the sets. The Plane adds set members before it deletes those no
// longer wanted (new state serves before old goes), so a set must hold
// what the kernel has and what is wanted together: a member counts if
// the kernel has it or an admitted contribution wants it.
type admission struct {
	limits Limits
	cur    *kstate
	// refs counts the admitted contributions that want each member the
	// kernel lacks; size is each set's members counted so.
	refs map[setEntry]int
	size map[string]int
}

// newAdmission starts from the kernel's members and those of accepted,
// the contributions that stay as they are.
func newAdmission(limits Limits, cur *kstate, accepted map[dataplane.ServicePortName]*contribution) *admission {
	a := &admission{limits: limits, cur: cur, refs: map[setEntry]int{}, size: map[string]int{}}
	for e := range cur.entries {
		a.size[e.set]++
	}
	for _, c := range accepted {
		a.add(c, 1)
	}
	return a
}

// add counts c's members in (sign 1) or out (-1).
func (a *admission) add(c *contribution, sign int) {
	if c == nil {
		return
	}
	for _, e := range c.entries {
		if a.cur.entries[e] {
			continue
		}
		before := a.refs[e]
		a.refs[e] += sign
		switch {
		case before == 0 && a.refs[e] > 0:
			a.size[e.set]++
		case before > 0 && a.refs[e] == 0:
			a.size[e.set]--
			delete(a.refs, e)
		}
	}
}

// admit replaces old (what the ServicePort has now, nil for nothing) by
// next if no set then holds more than its size allows, or more than it
// did already; otherwise it keeps old and says which sets are short.
func (a *admission) admit(old, next *contribution) error {
	before := maps.Clone(a.size)
	a.add(old, -1)
	a.add(next, 1)
	var short []string
	for _, set := range slices.Sorted(maps.Keys(a.size)) {
		n, max := a.size[set], a.limits.setSize(set)
		if n > max && n > before[set] {
			short = append(short, fmt.Sprintf("ipset %s needs %d of %d members (%s)", set, n, max, setHolds[roleOf(set)]))
		}
	}
	if len(short) == 0 {
		return nil
	}
	a.add(next, -1)
	a.add(old, 1)
	return fmt.Errorf("%s; fewer of those make it fit, or run kpr in --mode ebpf, which has no such limit", strings.Join(short, ", "))
}

// setHolds says what takes room in a set of each role, for the refusal's
// message.
var setHolds = map[string]string{
	setClusterIP:     "one per ClusterIP",
	setExternal:      "one per NodePort, external IP and load-balancer IP under externalTrafficPolicy Cluster",
	setExternalLocal: "one per NodePort, external IP and load-balancer IP under externalTrafficPolicy Local",
	setFirewall:      "one per load-balancer IP with loadBalancerSourceRanges",
	setSourceCIDR:    "one per loadBalancerSourceRange of each load-balancer IP",
	setLoopBack:      "one per endpoint address, protocol and port",
	setHealthCheck:   "one per ClusterIP, external IP and load-balancer IP of each externalTrafficPolicy Local Service with a healthCheckNodePort",
}

// roleOf is the role of the set named name.
func roleOf(name string) string {
	for _, role := range setRoles {
		if name == setName(role, false) || name == setName(role, true) {
			return role
		}
	}
	return ""
}

// room is what the bounded tables hold, to tell whether a call freed any.
type room struct {
	sets  map[string]int
	marks int
}

func (p *Plane) room() room {
	r := room{sets: map[string]int{}, marks: len(p.marks.byKey)}
	if p.cur != nil {
		for e := range p.cur.entries {
			r.sets[e.set]++
		}
	}
	return r
}

// freed reports whether the tables hold less than at before.
func (r room) freed(before room) bool {
	if r.marks < before.marks {
		return true
	}
	for set, n := range before.sets {
		if r.sets[set] < n {
			return true
		}
	}
	return false
}

// refusedChanges are the refused ServicePorts' latest states, to try
// again.
func (p *Plane) refusedChanges() map[dataplane.ServicePortName]*dataplane.ServicePort {
	out := make(map[dataplane.ServicePortName]*dataplane.ServicePort, len(p.refused))
	for n, r := range p.refused {
		out[n] = r.sp
	}
	return out
}

// settleRefusals records the outcome of a successful call: the names it
// decided (every name, for a Reconcile) are refused as now says, and
// logged when that changed.
func (p *Plane) settleRefusals(decided func(dataplane.ServicePortName) bool, now map[dataplane.ServicePortName]refusal) {
	p.refusedMu.Lock()
	defer p.refusedMu.Unlock()
	for n, old := range p.refused {
		if !decided(n) {
			continue
		}
		if _, still := now[n]; !still {
			delete(p.refused, n)
			if p.sps[n] == old.sp {
				p.log.Info("Service port refused earlier for lack of room in the kernel's tables now fits and is programmed",
					zap.Stringer("servicePort", n))
			}
		}
	}
	for n, r := range now {
		if old, was := p.refused[n]; !was || old.msg != r.msg {
			p.log.Warn("Service port does not fit in the kernel's tables: refused it alone, every other Service is still served; it is programmed once room is made",
				zap.Stringer("servicePort", n), zap.String("reason", r.msg))
		}
		p.refused[n] = r
	}
}

// refusalMessage says what a refused ServicePort lacks and what clients
// see meanwhile.
func refusalMessage(n dataplane.ServicePortName, cause error, served bool) string {
	until := "until then it is not served on this node"
	if served {
		until = "until then its previous state stays in the kernel"
	}
	return fmt.Sprintf("%s does not fit in the kernel's IPVS tables: %v; %s", n, cause, until)
}
