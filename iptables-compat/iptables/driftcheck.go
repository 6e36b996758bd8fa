package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kpr-io/kpr/dataplane"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
)

var _ dataplane.DriftChecker = (*Plane)(nil)

// StartDriftCheck begins a check of the tables against what the Plane
// wrote: one table and family after the other, each one iptables-save. So
// the periodic sync rewrites the tables only when something changed them.
func (p *Plane) StartDriftCheck() dataplane.DriftCheck {
	c := &driftCheck{p: p, dirty: p.dirty}
	for _, fam := range p.families {
		for _, table := range tables {
			c.todo = append(c.todo, tableRef{fam, table})
		}
	}
	return c
}

type tableRef struct {
	fam   netfilter.Family
	table string
}

// A table is read beside the sync loop, so that a large one does not hold
// changes up: iptables-nft-save of the nat table of 10,000 Services takes
// 4.5 s, and the comparison about one more. A Step waits readWait for the
// read and otherwise returns, not done, for the loop to run the Apply
// calls that are due; the next Step waits again.
const readWait = 20 * time.Millisecond

// maxSpoiledReads is how many reads in a row writes may spoil (landing
// while the table was read, so that it matches neither the state before
// nor the one after) before
// the next read is waited for to its end, the loop held up once, so that a
// steady stream of changes cannot keep a check from ending.
const maxSpoiledReads = 2

type driftCheck struct {
	p     *Plane
	dirty bool
	todo  []tableRef
	// read is the read of todo[0] under way, nil between two.
	read    *tableRead
	spoiled int
}

// tableRead is one table read and compared in the background with what
// the Plane had written when it began.
type tableRead struct {
	writes uint64 // the Plane's write count when the comparison began
	done   chan struct{}
	// saved, held and err are set before done is closed.
	saved *netfilter.SavedTable
	held  bool
	err   error
	// rejudged says saved was read for an earlier comparison.
	rejudged bool
}

func (c *driftCheck) Step() (done, held bool, err error) {
	if c.dirty || c.p.dirty {
		return true, false, nil // a failed call: only a Reconcile vouches for the tables
	}
	if c.read == nil {
		if len(c.todo) == 0 {
			return true, true, nil
		}
		c.read = c.p.startRead(c.todo[0])
	}
	if c.spoiled < maxSpoiledReads {
		select {
		case <-c.read.done:
		case <-time.After(readWait):
			return false, true, nil
		}
	} else {
		<-c.read.done
	}
	r := c.read
	c.read = nil
	if r.err == nil && !r.held && r.writes != c.p.writes {
		// A write landed while the table was read: the table may show
		// the state after it. Compare it once with the Plane's state now
		// (cheaper than reading it again); if that fails too, read it
		// again. A table that matches either state is not drift: what
		// the Plane wrote since went on top of what it holds.
		if !r.rejudged {
			c.read = c.p.compareAgain(c.todo[0], r.saved)
			return false, true, nil
		}
		c.spoiled++
		return false, true, nil
	}
	c.spoiled = 0
	ref := c.todo[0]
	c.todo = c.todo[1:]
	switch {
	case r.err != nil:
		return true, false, fmt.Errorf("read the %s %s table: %w", ref.fam, ref.table, r.err)
	case !r.held:
		return true, false, nil
	}
	return len(c.todo) == 0, true, nil
}

// startRead reads the table of ref and compares it with what the Plane
// holds now, in a goroutine of its own: it touches nothing the Plane
// changes (a write replaces p.rendered, it does not change the map), and
// the Runner runs commands concurrently.
func (p *Plane) startRead(ref tableRef) *tableRead {
	r := &tableRead{writes: p.writes, done: make(chan struct{})}
	run, save, rendered := p.run, p.tools[ref.fam].Save, p.rendered
	go func() {
		defer close(r.done)
		text, err := run.Run(save, []string{"-t", ref.table}, nil)
		if err != nil {
			r.err = err
			return
		}
		parsed, err := netfilter.ParseSave(text)
		if err != nil {
			r.err = err
			return
		}
		r.saved = parsed[ref.table]
		r.held = holds(ref, p.cfg, r.saved, rendered)
	}()
	return r
}

// compareAgain compares a table already read with what the Plane holds
// now, in the background as startRead does.
func (p *Plane) compareAgain(ref tableRef, saved *netfilter.SavedTable) *tableRead {
	r := &tableRead{writes: p.writes, done: make(chan struct{}), saved: saved, rejudged: true}
	rendered := p.rendered
	go func() {
		defer close(r.done)
		r.held = holds(ref, p.cfg, saved, rendered)
	}()
	return r
}

// holds reports whether saved is what rendered writes into the table:
// the base jumps, no per-ServicePort chain nobody owns, and every chain
// the Plane writes with the same rules, compared by what each rule does,
// since iptables-save reorders and respells matches.
func holds(ref tableRef, cfg config, saved *netfilter.SavedTable, rendered map[dataplane.ServicePortName]*renderedPort) bool {
	if saved == nil || len(netfilter.MissingJumps(ref.table, baseJumpsOf(ref.fam, cfg), saved)) > 0 {
		return false
	}
	want := tableInputOf(ref.fam, ref.table, cfg, rendered, nil, nil, true)
	if ref.table == tableNAT {
		want.rewrite = want.ports // the per-ServicePort chains are nat's
	}
	if len(staleChains(saved, want.ports)) > 0 {
		return false
	}
	expected := map[string][]string{}
	malformed := false
	want.eachLine(func(l string) {
		if !strings.HasPrefix(l, "-A ") {
			return
		}
		words, err := netfilter.SplitWords(l)
		if err != nil {
			malformed = true
			return
		}
		expected[words[1]] = append(expected[words[1]], fingerprint(words))
	})
	if malformed {
		return false
	}
	shared := sharedChains(ref.table, ref.fam, cfg)
	got := map[string][]string{}
	for _, r := range saved.Rules {
		// A shared chain is the Plane's even when it writes no rule
		// into it: a rule another program put there is drift.
		if _, ours := expected[r[1]]; ours || slices.Contains(shared, r[1]) {
			got[r[1]] = append(got[r[1]], fingerprint(r))
		}
	}
	for chain, rules := range expected {
		if !saved.HasChain(chain) || !slices.Equal(got[chain], rules) {
			return false
		}
	}
	// A chain the Plane declares empty must be there and stay empty.
	for _, c := range shared {
		if !saved.HasChain(c) || (expected[c] == nil && len(got[c]) > 0) {
			return false
		}
	}
	return true
}

// fingerprint is what a rule does, in a form that is the same for the
// restore line kpr writes and for iptables-save's spelling of it. MARK's
// options are left out: iptables-save turns --or-mark and --xor-mark into
// --set-xmark.
func fingerprint(r []string) string {
	var parts []string
	neg := false
	for i := 2; i < len(r); i++ {
		w := r[i]
		if w == "!" {
			neg = true
			continue
		}
		arg := ""
		if i+1 < len(r) {
			arg = r[i+1]
		}
		prefix := ""
		if neg {
			prefix = "!"
		}
		neg = false
		switch w {
		case "-d", "-s":
			parts = append(parts, prefix+w+"="+normalAddr(arg))
		case "-i", "-p", "--dport", "--src-type", "--dst-type", "--ctstate", "--mark", "-j", "--to-destination",
			"--seconds", "--name":
			parts = append(parts, prefix+w+"="+arg)
		case "--set", "--rcheck":
			parts = append(parts, prefix+w)
		case "--probability":
			f, _ := strconv.ParseFloat(arg, 64)
			parts = append(parts, prefix+w+"="+strconv.FormatFloat(f, 'f', 6, 64))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// normalAddr drops the /32 or /128 iptables-save adds to an address.
func normalAddr(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil && p.IsSingleIP() {
		return p.Addr().String()
	}
	return s
}
