package tcnat

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/kpr-io/kpr/bpf"
	"github.com/kpr-io/kpr/dataplane"
)

// What BenchmarkNodePortHostile measured, and its judgement against issue
// 20's targets.

// floodHeld is what one flood's flows hold on a node at one moment.
type floodHeld struct {
	Taken     bool
	Entries   int           // conntrack entries (kpr: both of a flow's; netfilter: one per flow)
	SNATPorts int           // of them, flows SNATed to the node's address: a port each
	At        time.Duration // after the flood stopped (0: during it)
}

// hostileWindow is one side under one flood.
type hostileWindow struct {
	Side     string
	Rate     int     // SYN/s asked
	Sent     int     // spoofed SYNs sent
	SentRate float64 // SYN/s sent
	// The legitimate client's requests during the flood.
	Served, Failed int
	// Slow counts the served requests that waited out a retransmission
	// timeout (a lost SYN or SYN-ACK: TCP's first RTO is 1 s).
	Slow          int
	Elapsed       time.Duration
	During, After floodHeld
	Note          string
}

func (w *hostileWindow) reqRate() float64 {
	if w.Elapsed <= 0 {
		return 0
	}
	return float64(w.Served) / w.Elapsed.Seconds()
}

func (w *hostileWindow) successRate() float64 {
	if w.Served+w.Failed == 0 {
		return 0
	}
	return float64(w.Served) / float64(w.Served+w.Failed)
}

type hostileResults struct {
	sides        []string // kpr first
	rates        []int
	flood, after time.Duration
	windows      []*hostileWindow
}

func (r *hostileResults) window(side string, rate int) *hostileWindow {
	for _, w := range r.windows {
		if w.Side == side && w.Rate == rate {
			return w
		}
	}
	return nil
}

// highestClean is the highest flood rate up to which side's legitimate
// client saw no failure: every rate up to it was failure-free (0 if the
// first one was not). One failure at a lower rate is the verdict, even if
// a higher rate happened to pass.
func (r *hostileResults) highestClean(side string) int {
	clean := 0
	for _, rate := range r.rates {
		w := r.window(side, rate)
		if w == nil || w.Failed > 0 || w.Served == 0 {
			break
		}
		clean = rate
	}
	return clean
}

type hostileTarget struct {
	name   string
	met    bool
	detail string
}

// targets judges kpr against each iptables side: its highest failure-free
// flood rate at least theirs; no entry of its floods alive `after` the
// flood; at each rate, a legitimate request rate at least theirs.
func (r *hostileResults) targets() []hostileTarget {
	var out []hostileTarget
	kpr := sideKpr
	for _, ipt := range r.sides[1:] {
		k, i := r.highestClean(kpr), r.highestClean(ipt)
		out = append(out, hostileTarget{
			name:   "highest failure-free flood rate, kpr >= " + ipt,
			met:    k >= i,
			detail: fmt.Sprintf("kpr %d SYN/s, %s %d SYN/s", k, ipt, i),
		})
	}
	var left []string
	for _, rate := range r.rates {
		w := r.window(kpr, rate)
		if w == nil || !w.After.Taken {
			left = append(left, fmt.Sprintf("%d SYN/s: not counted", rate))
		} else if w.After.Entries > 0 || w.After.SNATPorts > 0 || w.After.At < r.after {
			left = append(left, fmt.Sprintf("%d SYN/s: %d entries, %d SNAT ports %s after", rate, w.After.Entries, w.After.SNATPorts, w.After.At.Round(time.Second)))
		}
	}
	out = append(out, hostileTarget{
		name:   fmt.Sprintf("no entry of kpr's floods outlives %s", r.after),
		met:    len(left) == 0,
		detail: orNone(left),
	})
	for _, ipt := range r.sides[1:] {
		var below []string
		for _, rate := range r.rates {
			k, i := r.window(kpr, rate), r.window(ipt, rate)
			if k == nil || i == nil {
				below = append(below, fmt.Sprintf("%d SYN/s: not measured", rate))
			} else if k.reqRate() < i.reqRate() {
				below = append(below, fmt.Sprintf("%d SYN/s: kpr %.0f req/s < %.0f", rate, k.reqRate(), i.reqRate()))
			}
		}
		out = append(out, hostileTarget{
			name:   "legitimate request rate at each flood rate, kpr >= " + ipt,
			met:    len(below) == 0,
			detail: orNone(below),
		})
	}
	return out
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "at every rate"
	}
	return strings.Join(s, "; ")
}

// markdown is the results table, the highest failure-free rates and the
// targets' verdicts.
func (r *hostileResults) markdown() string {
	var b strings.Builder
	after := r.after.Round(time.Second)
	fmt.Fprintf(&b, "| flood SYN/s (sent) | side | legitimate req/s | success | failed | slow (≥ 0.9 s) | flood's conntrack entries: during / %s after | flood's SNAT ports: during / %s after |\n", after, after)
	b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, rate := range r.rates {
		for _, side := range r.sides {
			w := r.window(side, rate)
			if w == nil {
				continue
			}
			fmt.Fprintf(&b, "| %d (%.0f) | %s | %.0f | %.3f %% | %d | %d | %d / %s | %d / %s |\n",
				rate, w.SentRate, side, w.reqRate(), 100*w.successRate(), w.Failed, w.Slow,
				w.During.Entries, heldAfter(w.After, w.After.Entries), w.During.SNATPorts, heldAfter(w.After, w.After.SNATPorts))
		}
	}
	b.WriteString("\n| side | highest failure-free flood rate (SYN/s) |\n|---|---:|\n")
	for _, side := range r.sides {
		fmt.Fprintf(&b, "| %s | %d |\n", side, r.highestClean(side))
	}
	b.WriteString("\n| target | verdict | detail |\n|---|---|---|\n")
	for _, t := range r.targets() {
		verdict := "**not met**"
		if t.met {
			verdict = "met"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.name, verdict, t.detail)
	}
	return b.String()
}

func heldAfter(h floodHeld, n int) string {
	if !h.Taken {
		return "—"
	}
	return fmt.Sprint(n)
}

// docSection is markdown() with what the run was and the notes of each
// window (kpr's counters, a first failure).
func (r *hostileResults) docSection() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Floods of %s each, at %s SYN/s; the entries counted at the end of each flood (it still running) and %s after it stopped. "+
		"kpr keeps two conntrack entries per flow (forward and reply; the reply entry of a SNATed flow is its SNAT port), netfilter one.\n\n",
		r.flood, joinInts(r.rates), r.after)
	b.WriteString(r.markdown())
	var notes []string
	for _, w := range r.windows {
		if w.Note != "" {
			notes = append(notes, fmt.Sprintf("- %s at %d SYN/s: %s", w.Side, w.Rate, w.Note))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n" + strings.Join(notes, "\n") + "\n")
	}
	return b.String()
}

func joinInts(ns []int) string {
	var s []string
	for _, n := range ns {
		s = append(s, fmt.Sprint(n))
	}
	return strings.Join(s, ", ")
}

// The markers around the section of a document that the benchmark
// rewrites.
const (
	hostileBegin = "<!-- BenchmarkNodePortHostile results: begin (generated) -->"
	hostileEnd   = "<!-- BenchmarkNodePortHostile results: end -->"
)

// spliceSection puts section between doc's markers, in place of what was
// there.
func spliceSection(doc, section string) (string, error) {
	before, rest, ok := strings.Cut(doc, hostileBegin)
	if !ok {
		return "", fmt.Errorf("no line %q to write the results after", hostileBegin)
	}
	_, after, ok := strings.Cut(rest, hostileEnd)
	if !ok {
		return "", fmt.Errorf("no line %q after %q", hostileEnd, hostileBegin)
	}
	return before + hostileBegin + "\n" + strings.TrimRight(section, "\n") + "\n" + hostileEnd + after, nil
}

// The report's aggregation: the highest failure-free rate stops at the
// first rate with a failure, and each target is judged from the windows.
func TestHostileReportJudgesTargets(t *testing.T) {
	win := func(side string, rate, served, failed int, after floodHeld) *hostileWindow {
		return &hostileWindow{Side: side, Rate: rate, Served: served, Failed: failed, Elapsed: 10 * time.Second, After: after}
	}
	gone := floodHeld{Taken: true, At: 121 * time.Second}
	r := &hostileResults{sides: []string{sideKpr, "iptables-legacy"}, rates: []int{500, 1000, 2000}, after: 120 * time.Second,
		windows: []*hostileWindow{
			win(sideKpr, 500, 1000, 0, gone), win("iptables-legacy", 500, 900, 0, gone),
			win(sideKpr, 1000, 1000, 0, gone), win("iptables-legacy", 1000, 900, 2, gone),
			// A pass above a failure does not count.
			win(sideKpr, 2000, 800, 1, floodHeld{Taken: true, Entries: 4, SNATPorts: 2, At: 121 * time.Second}), win("iptables-legacy", 2000, 900, 0, gone),
		}}
	if got := r.highestClean(sideKpr); got != 1000 {
		t.Errorf("kpr's highest failure-free rate %d, want 1000", got)
	}
	if got := r.highestClean("iptables-legacy"); got != 500 {
		t.Errorf("iptables-legacy's highest failure-free rate %d, want 500 (a failure at 1000)", got)
	}
	want := map[string]bool{
		"highest failure-free flood rate, kpr >= iptables-legacy":            true,
		"no entry of kpr's floods outlives 2m0s":                             false,
		"legitimate request rate at each flood rate, kpr >= iptables-legacy": false,
	}
	got := r.targets()
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %+v", len(got), len(want), got)
	}
	for _, tg := range got {
		if met, ok := want[tg.name]; !ok || met != tg.met {
			t.Errorf("target %q met=%v (%s), want %v (known: %v)", tg.name, tg.met, tg.detail, met, ok)
		}
	}
	if d := got[1].detail; !strings.Contains(d, "2000 SYN/s: 4 entries, 2 SNAT ports 2m1s after") {
		t.Errorf("outlived detail %q", d)
	}
	if d := got[2].detail; d != "2000 SYN/s: kpr 80 req/s < 90" {
		t.Errorf("request rate detail %q", d)
	}
	// An after-count taken too early, or never, fails the target.
	r.windows[4].After = floodHeld{Taken: true, At: 60 * time.Second}
	r.windows[4].Failed = 0
	r.windows[4].Served = 1000
	if tg := r.targets()[1]; tg.met {
		t.Errorf("entries counted 60s after a flood met the 120s target: %s", tg.detail)
	}
	r.windows[4].After = gone
	if tg := r.targets()[1]; !tg.met {
		t.Errorf("no entry left, yet: %s", tg.detail)
	}
	r.windows[0].After = floodHeld{}
	if tg := r.targets()[1]; tg.met {
		t.Errorf("a flood never counted again met the target")
	}
	md := r.markdown()
	for _, s := range []string{"| 500 (0) | kpr | 100 | 100.000 % | 0 | 0 | 0 / — | 0 / — |", "| iptables-legacy | 500 |", "| kpr | 2000 |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestParseRates(t *testing.T) {
	if got, err := parseRates("500,1000, 2000,5000"); err != nil || !slices.Equal(got, []int{500, 1000, 2000, 5000}) {
		t.Errorf("parseRates: %v, %v", got, err)
	}
	for _, bad := range []string{"", "500,", "0", "-5", "1k", "10.5"} {
		if got, err := parseRates(bad); err == nil {
			t.Errorf("parseRates(%q) = %v, want an error", bad, got)
		}
	}
}

// The section between the markers is replaced, the rest kept, and a
// document without them refused.
func TestSpliceSection(t *testing.T) {
	doc := "intro\n" + hostileBegin + "\nold table\n" + hostileEnd + "\nafter\n"
	got, err := spliceSection(doc, "new table\n\n")
	if want := "intro\n" + hostileBegin + "\nnew table\n" + hostileEnd + "\nafter\n"; err != nil || got != want {
		t.Errorf("spliceSection: %q, %v; want %q", got, err, want)
	}
	if again, err := spliceSection(got, "new table"); err != nil || again != got {
		t.Errorf("splicing the same section again changed the document: %q, %v", again, err)
	}
	for _, bad := range []string{"intro\n", hostileBegin + "\nno end\n", hostileEnd + "\n" + hostileBegin} {
		if _, err := spliceSection(bad, "x"); err == nil {
			t.Errorf("spliceSection(%q) took it", bad)
		}
	}
}

// Flood i of n sends from its own part of floodSources, and the parts do
// not overlap.
func TestSourceBlocks(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5} {
		var blocks []netip.Prefix
		for i := 0; i < n; i++ {
			b := sourceBlock(i, n)
			if !floodSources.Contains(b.Addr()) || b.Bits() < floodSources.Bits() {
				t.Errorf("block %d of %d: %s, not within %s", i, n, b, floodSources)
			}
			for _, o := range blocks {
				if o.Overlaps(b) {
					t.Errorf("blocks %s and %s of %d overlap", o, b, n)
				}
			}
			blocks = append(blocks, b)
		}
	}
	if b := sourceBlock(3, 4); b != netip.MustParsePrefix("198.19.128.0/17") {
		t.Errorf("block 3 of 4: %s", b)
	}
}

// synPacket is a SYN with valid checksums, as the kernel's raw socket
// sends it.
func TestSynPacket(t *testing.T) {
	src, dst := netip.MustParseAddrPort("198.18.3.4:40000"), netip.MustParseAddrPort("192.168.100.10:30500")
	pkt := synPacket(src, dst, 123456)
	frame := append(make([]byte, 14), pkt...)
	frame[12], frame[13] = 0x08, 0x00 // IPv4
	// parse fails the test unless both checksums validate.
	if got := parse(t, frame); got.src != src || got.dst != dst || got.proto != dataplane.TCP || len(got.payload) != 0 {
		t.Errorf("synPacket parsed as %+v", got)
	}
	tcp, _ := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default).TransportLayer().(*layers.TCP)
	if tcp == nil || !tcp.SYN || tcp.ACK || tcp.RST || tcp.FIN || tcp.Seq != 123456 || len(tcp.Options) == 0 || tcp.Options[0].OptionType != layers.TCPOptionKindMSS {
		t.Errorf("synPacket's TCP header: %+v", tcp)
	}
}

func TestMovedDropsNamesEveryDropCounterThatMoved(t *testing.T) {
	before := bpf.KprNatStats{DropSnatPorts: 3, DropOutOfWindow: 1, Translated: 5}
	after := bpf.KprNatStats{DropSnatPorts: 3, DropOutOfWindow: 4, DropReplyTaken: 2, Translated: 9}
	if got, want := movedDrops(before, after), "OutOfWindow 3, ReplyTaken 2"; got != want {
		t.Errorf("movedDrops = %q, want %q", got, want)
	}
	if got := movedDrops(after, after); got != "none" {
		t.Errorf("movedDrops of no change = %q, want none", got)
	}
}
