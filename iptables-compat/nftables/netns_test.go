package nftables

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/kpr-io/kpr/dataplane/dataplanetest"
	"github.com/kpr-io/kpr/dataplane/leftovers"
	"github.com/kpr-io/kpr/iptables-compat/netfilter"
	"github.com/kpr-io/kpr/tests/namedns"
)

// requireRoot skips unless the test may create network namespaces: as
// root, with nft, and not under -short.
func requireRoot(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping under -short: runs nft inside a network namespace of its own, which needs root")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: runs nft inside a network namespace of its own; run as root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("skipping: no nft binary (apt-get install nftables)")
	}
}

// newNetNS creates an empty network namespace for the test and returns
// its name and the Interface to kpr's table inside it.
func newNetNS(t testing.TB) (string, knftables.Interface) {
	t.Helper()
	name := namedns.ForTest(t, "kpr-nft-")
	nft, err := Open(filepath.Join("/run/netns", name))
	if err != nil {
		t.Fatal(err)
	}
	return name, nft
}

// listTableIn is `nft list table inet kpr` in the named namespace.
func listTableIn(ns string) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", string(Family), TableName).CombinedOutput()
	if err != nil && strings.Contains(string(out), "No such file or directory") {
		return "", nil
	}
	if err != nil {
		return "", &exec.ExitError{Stderr: out}
	}
	return string(out), nil
}

// The conformance suite against the real nft and kernel, each scenario in
// a namespace of its own: the observer parses what nft lists, so it also
// checks that the kernel took every rule as rendered.
func TestConformanceInANetNS(t *testing.T) {
	requireRoot(t)
	dataplanetest.Run(t, func(t *testing.T) dataplanetest.Backend {
		ns, nft := newNetNS(t)
		return conformanceBackend(t, nft, func() (snapshot, error) {
			text, err := listTableIn(ns)
			if err != nil {
				return snapshot{}, err
			}
			return parseListing(text)
		})
	})
}

// The drift check holds over a table the kernel holds as the Plane wrote
// it: what nft lists back (elements, rule counts, names) must compare
// equal to the rendering for every shape of Service.
func TestDriftCheckHoldsOverRealTables(t *testing.T) {
	requireRoot(t)
	for name, sps := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			ns, nft := newNetNS(t)
			p, err := New(Options{NFT: nft, Families: bothFamilies})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Reconcile(changes(sps...)); err != nil {
				t.Fatal(err)
			}
			// Another writer's commit, so that the check reads and
			// compares the whole table rather than trust the generation.
			commitElsewhere(t, ns)
			if held := dataplanetest.DriftCheckHolds(t, p); !held {
				t.Fatal("the drift check finds drift in a table the Plane has just written")
			}
		})
	}
}

// commitElsewhere commits a transaction of another writer's in the
// namespace: a table of its own, which moves the ruleset's generation.
func commitElsewhere(t *testing.T, ns string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", ns, "nft", "add", "table", "ip", "elsewhere").CombinedOutput(); err != nil {
		t.Fatalf("nft add table ip elsewhere: %v: %s", err, out)
	}
}

// nftIn runs nft with args in the namespace.
func nftIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// driftSteps runs a whole drift check and returns how many steps it took
// and whether it held.
func driftSteps(t *testing.T, p *Plane) (int, bool) {
	t.Helper()
	c := p.StartDriftCheck()
	for steps := 1; steps < 10000; steps++ {
		done, held, err := c.Step()
		if err != nil {
			t.Fatal(err)
		}
		if done {
			return steps, held
		}
	}
	t.Fatal("the drift check did not end in 10,000 steps")
	return 0, false
}

// Where nothing but the Plane has committed since its table was last
// known as written, one read of the ruleset's generation settles a drift
// check; another writer's commit makes the next check read the table,
// a window of chains a step, and a rule planted in the last window is
// found.
func TestDriftCheckTrustsOnlyItsOwnGenerations(t *testing.T) {
	requireRoot(t)
	ns, nft := newNetNS(t)
	p, err := New(Options{NFT: nft, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	// 300 Services of 10 endpoints: 3,300 chains, seven windows.
	if err := p.Reconcile(dataplanetest.BenchServices(300)); err != nil {
		t.Fatal(err)
	}
	if steps, held := driftSteps(t, p); !held || steps != 1 {
		t.Fatalf("after the Plane's own full write: held %v in %d steps, want held in 1", held, steps)
	}
	sp := dataplanetest.BenchService(7, 1)
	if err := p.Apply(changes(sp)); err != nil {
		t.Fatal(err)
	}
	if steps, held := driftSteps(t, p); !held || steps != 1 {
		t.Fatalf("after the Plane's own partial write: held %v in %d steps, want held in 1", held, steps)
	}

	commitElsewhere(t, ns)
	steps, held := driftSteps(t, p)
	if !held || steps < 4 {
		t.Fatalf("after another writer's commit: held %v in %d steps, want held, having read the table", held, steps)
	}
	if steps, held := driftSteps(t, p); !held || steps != 1 {
		t.Fatalf("after a check that held: held %v in %d steps, want held in 1", held, steps)
	}

	// A rule planted in a chain of the last Service in name order, which
	// the last window counts.
	last := dataplanetest.BenchService(99, 0)
	chain := p.rendered[last.Name].rules[netfilter.IPv4].chains[0].name
	nftIn(t, ns, "add", "rule", string(Family), TableName, chain, "counter")
	if _, held := driftSteps(t, p); held {
		t.Fatalf("the drift check missed a rule added to chain %s", chain)
	}

	// An empty chain of someone else's in kpr's table: no rule count
	// sees it, the table's count of its objects does.
	if err := p.Reconcile(dataplanetest.BenchServices(300)); err != nil {
		t.Fatal(err)
	}
	nftIn(t, ns, "add", "chain", string(Family), TableName, "stray")
	if _, held := driftSteps(t, p); held {
		t.Fatal("the drift check missed a chain added to the table")
	}
}

var quoted = regexp.MustCompile(`"([^"]*)"`)

// parseListing reads `nft list table` output into a snapshot: chains with
// their rules, maps with their elements, sets with their timeouts.
func parseListing(text string) (snapshot, error) {
	s := snapshot{chains: map[string][]string{}, elements: map[string]map[string]string{}, sets: map[string]time.Duration{}}
	text = quoted.ReplaceAllString(text, "$1")
	lines := strings.Split(text, "\n")
	var kind, name string
	var elems strings.Builder
	inElems := false
	for _, raw := range lines {
		l := strings.TrimSpace(raw)
		switch {
		case l == "" || strings.HasPrefix(l, "table "):
			continue
		case inElems:
			elems.WriteString(" " + l)
			if strings.HasSuffix(l, "}") {
				inElems = false
				addElements(s.elements[name], elems.String())
			}
		case strings.HasPrefix(l, "chain ") || strings.HasPrefix(l, "map ") || strings.HasPrefix(l, "set "):
			f := strings.Fields(l)
			kind, name = f[0], f[1]
			switch kind {
			case "chain":
				s.chains[name] = []string{}
			case "map":
				s.elements[name] = map[string]string{}
			}
		case l == "}":
			kind, name = "", ""
		case kind == "chain":
			if strings.HasPrefix(l, "type ") {
				continue
			}
			s.chains[name] = append(s.chains[name], l)
		case kind == "map" && strings.HasPrefix(l, "elements = {"):
			elems.Reset()
			elems.WriteString(strings.TrimPrefix(l, "elements = "))
			if strings.HasSuffix(l, "}") {
				addElements(s.elements[name], elems.String())
			} else {
				inElems = true
			}
		case kind == "set" && strings.HasPrefix(l, "timeout "):
			d, err := parseNFTDuration(strings.TrimPrefix(l, "timeout "))
			if err != nil {
				return s, err
			}
			s.sets[name] = d
		}
	}
	return s, nil
}

// addElements reads "{ k1 . p . 80 : goto x, k2 ... }" into m.
func addElements(m map[string]string, text string) {
	text = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(text), "{"), "}")
	for _, e := range strings.Split(text, ",") {
		k, v, ok := strings.Cut(e, ":")
		if !ok {
			continue
		}
		// An IPv6 key holds colons too: the verdict follows the last " : ".
		if i := strings.LastIndex(e, " : "); i >= 0 {
			k, v = e[:i], e[i+3:]
		}
		m[strings.Join(strings.Fields(k), " ")] = strings.Join(strings.Fields(v), " ")
	}
}

// parseNFTDuration reads nft's durations: 3h, 1d2h, 1m30s.
func parseNFTDuration(s string) (time.Duration, error) {
	var total time.Duration
	if d, rest, ok := strings.Cut(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, err
		}
		total += time.Duration(n) * 24 * time.Hour
		s = rest
	}
	if s == "" {
		return total, nil
	}
	d, err := time.ParseDuration(s)
	return total + d, err
}

// A mode switch and `kpr cleanup` leave nothing of the nftables mode: the
// table goes where the mode recorded writing it, and the record with it;
// where it did not record, nothing is touched.
func TestRemoveLeftoversInANetNS(t *testing.T) {
	requireRoot(t)
	ns, nft := newNetNS(t)
	path := filepath.Join("/run/netns", ns)
	bpfRoot := t.TempDir()
	if err := Record(bpfRoot, path); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{NFT: nft, Families: bothFamilies})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reconcile(changes(goldenCases()["loadbalancer-source-ranges"]...)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenInspector(bpfRoot, path, netfilter.Masquerade{}); err != nil {
		t.Fatalf("OpenInspector over the recorded table: %v", err)
	}
	removed, err := RemoveLeftovers(bpfRoot, path)
	if err != nil || !removed.Found || removed.Count == 0 {
		t.Fatalf("RemoveLeftovers = %+v, %v; want the table's chains counted", removed, err)
	}
	if text, err := listTableIn(ns); err != nil || text != "" {
		t.Fatalf("after RemoveLeftovers the namespace still lists kpr's table (%v):\n%s", err, text)
	}
	if removed, err := RemoveLeftovers(bpfRoot, path); err != nil || removed.Found {
		t.Fatalf("second RemoveLeftovers = %+v, %v; want nothing found (the record went)", removed, err)
	}
	if _, err := OpenInspector(bpfRoot, path, netfilter.Masquerade{}); !errors.Is(err, leftovers.ErrNotRecorded) {
		t.Fatalf("OpenInspector without a record = %v, want ErrNotRecorded", err)
	}
}
