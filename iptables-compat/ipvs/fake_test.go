package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"

	"github.com/kpr-io/kpr/dataplane"
)

// fakeKernel is an in-memory Kernel that refuses what the kernel refuses:
// adding what exists, changing or deleting what does not.
type fakeKernel struct {
	mu       sync.Mutex
	services map[ServiceKey]*ServiceState
	device   bool
	addrs    map[netip.Addr]bool
	sets     map[string]map[Entry]bool
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{services: map[ServiceKey]*ServiceState{}, addrs: map[netip.Addr]bool{}, sets: map[string]map[Entry]bool{}}
}

var errFake = errors.New("fake kernel refuses")

func (f *fakeKernel) Services() (map[ServiceKey]*ServiceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[ServiceKey]*ServiceState{}
	for k, s := range f.services {
		out[k] = s.clone()
	}
	return out, nil
}

func (f *fakeKernel) Dests(k ServiceKey) (map[dataplane.Backend]Dest, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return nil, fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	return maps.Clone(s.Dests), nil
}

func (f *fakeKernel) AddService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[s.Key]; ok {
		return fmt.Errorf("%w: virtual server %s exists", errFake, s.Key)
	}
	f.services[s.Key] = &ServiceState{Service: s, Dests: map[dataplane.Backend]Dest{}}
	return nil
}

func (f *fakeKernel) UpdateService(s Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old, ok := f.services[s.Key]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, s.Key)
	}
	old.Service = s
	return nil
}

func (f *fakeKernel) DelService(k ServiceKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.services[k]; !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	delete(f.services, k)
	return nil
}

func (f *fakeKernel) dest(k ServiceKey, b dataplane.Backend, weight int, add bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	d, exists := s.Dests[b]
	if exists == add {
		return fmt.Errorf("%w: real server %s of %s: exists %v", errFake, b, k, exists)
	}
	d.Weight = weight
	s.Dests[b] = d
	return nil
}

func (f *fakeKernel) AddDest(k ServiceKey, b dataplane.Backend, w int) error {
	return f.dest(k, b, w, true)
}

func (f *fakeKernel) UpdateDest(k ServiceKey, b dataplane.Backend, w int) error {
	return f.dest(k, b, w, false)
}

func (f *fakeKernel) DelDest(k ServiceKey, b dataplane.Backend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[k]
	if !ok {
		return fmt.Errorf("%w: no virtual server %s", errFake, k)
	}
	if _, ok := s.Dests[b]; !ok {
		return fmt.Errorf("%w: no real server %s of %s", errFake, b, k)
	}
	delete(s.Dests, b)
	return nil
}

// setConns gives a real server connections, as traffic would.
func (f *fakeKernel) setConns(k ServiceKey, b dataplane.Backend, active int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.services[k].Dests[b]
	d.Active = active
	f.services[k].Dests[b] = d
}

func (f *fakeKernel) EnsureDevice() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.device = true
	return nil
}

func (f *fakeKernel) DeviceAddrs() ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []netip.Addr
	for a := range f.addrs {
		out = append(out, a)
	}
	return out, nil
}

func (f *fakeKernel) AddAddr(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.device || f.addrs[a] {
		return fmt.Errorf("%w: bind %s (device %v, bound %v)", errFake, a, f.device, f.addrs[a])
	}
	f.addrs[a] = true
	return nil
}

func (f *fakeKernel) DelAddr(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.addrs[a] {
		return fmt.Errorf("%w: %s is not bound", errFake, a)
	}
	delete(f.addrs, a)
	return nil
}

func (f *fakeKernel) DelDevice() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.device = false
	f.addrs = map[netip.Addr]bool{}
	return nil
}

func (f *fakeKernel) EnsureSet(s SetSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sets[s.Name] == nil {
		f.sets[s.Name] = map[Entry]bool{}
	}
	return nil
}

func (f *fakeKernel) SetEntries(name string) ([]Entry, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, ok := f.sets[name]
	var out []Entry
	for e := range set {
		out = append(out, e)
	}
	return out, ok, nil
}

func (f *fakeKernel) AddEntry(name string, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, ok := f.sets[name]
	if !ok || set[e] {
		return fmt.Errorf("%w: add %s to %s (set exists %v)", errFake, e, name, ok)
	}
	set[e] = true
	return nil
}

func (f *fakeKernel) DelEntry(name string, e Entry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sets[name][e] {
		return fmt.Errorf("%w: %s is not in %s", errFake, e, name)
	}
	delete(f.sets[name], e)
	return nil
}

func (f *fakeKernel) DestroySet(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.sets, name)
	return nil
}

// fakeIPTables is an in-memory iptables-restore --noflush and
// iptables-save for what the Plane writes: each binary's family has its
// tables; a restore applies whole or not at all.
type fakeIPTables struct {
	mu     sync.Mutex
	tables map[string]map[string]*fakeTable // family ("iptables", "ip6tables") -> table
}

type fakeTable struct {
	order []string
	rules map[string][]string
}

func newFakeIPTables() *fakeIPTables {
	return &fakeIPTables{tables: map[string]map[string]*fakeTable{}}
}

func builtins(table string) []string {
	if table == "nat" {
		return []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}
	}
	return []string{"INPUT", "FORWARD", "OUTPUT"}
}

func (f *fakeIPTables) table(fam, name string) *fakeTable {
	if f.tables[fam] == nil {
		f.tables[fam] = map[string]*fakeTable{}
	}
	t := f.tables[fam][name]
	if t == nil {
		t = &fakeTable{rules: map[string][]string{}}
		for _, c := range builtins(name) {
			t.order = append(t.order, c)
			t.rules[c] = nil
		}
		f.tables[fam][name] = t
	}
	return t
}

func (t *fakeTable) clone() *fakeTable {
	out := &fakeTable{order: append([]string{}, t.order...), rules: map[string][]string{}}
	for c, r := range t.rules {
		out.rules[c] = append([]string{}, r...)
	}
	return out
}

func (f *fakeIPTables) Run(name string, args []string, stdin []byte) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fam := "iptables"
	if strings.HasPrefix(name, "ip6tables") {
		fam = "ip6tables"
	}
	switch {
	case strings.HasSuffix(name, "-save"):
		tname := args[len(args)-1]
		t := f.table(fam, tname)
		var b strings.Builder
		b.WriteString("*" + tname + "\n")
		for _, c := range t.order {
			b.WriteString(":" + c + " - [0:0]\n")
		}
		for _, c := range t.order {
			for _, r := range t.rules[c] {
				b.WriteString("-A " + c + " " + r + "\n")
			}
		}
		b.WriteString("COMMIT\n")
		return []byte(b.String()), nil
	case strings.HasSuffix(name, "-restore"):
		return nil, f.restore(fam, string(stdin))
	}
	return nil, fmt.Errorf("fake iptables: unknown binary %s", name)
}

func (f *fakeIPTables) restore(fam, input string) error {
	var name string
	var t *fakeTable
	for _, l := range strings.Split(input, "\n") {
		if l == "" {
			continue
		}
		verb, rest, _ := strings.Cut(l, " ")
		switch {
		case strings.HasPrefix(l, "*"):
			name = l[1:]
			t = f.table(fam, name).clone()
		case l == "COMMIT":
			f.tables[fam][name] = t
		case strings.HasPrefix(l, ":"):
			c := strings.Fields(l[1:])[0]
			if _, ok := t.rules[c]; !ok {
				t.order = append(t.order, c)
			}
			t.rules[c] = nil
		case verb == "-A" || verb == "-I" || verb == "-D":
			c, r, _ := strings.Cut(rest, " ")
			if _, ok := t.rules[c]; !ok {
				return fmt.Errorf("fake iptables-restore: no chain %s: %s", c, l)
			}
			switch verb {
			case "-A":
				t.rules[c] = append(t.rules[c], r)
			case "-I":
				t.rules[c] = append([]string{r}, t.rules[c]...)
			case "-D":
				i := indexOf(t.rules[c], r)
				if i < 0 {
					return fmt.Errorf("fake iptables-restore: no such rule: %s", l)
				}
				t.rules[c] = append(t.rules[c][:i], t.rules[c][i+1:]...)
			}
		case verb == "-X":
			for c, rs := range t.rules {
				for _, r := range rs {
					if strings.HasSuffix(r, "-j "+rest) {
						return fmt.Errorf("fake iptables-restore: %s is referenced from %s", rest, c)
					}
				}
			}
			delete(t.rules, rest)
			t.order = deleteString(t.order, rest)
		default:
			return fmt.Errorf("fake iptables-restore: cannot parse %q", l)
		}
	}
	return nil
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func deleteString(s []string, v string) []string {
	if i := indexOf(s, v); i >= 0 {
		return append(s[:i], s[i+1:]...)
	}
	return s
}
