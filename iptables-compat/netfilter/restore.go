package netfilter

import "bytes"

// Comment is the comment match of a rule, as restore input.
func Comment(text string) string { return `-m comment --comment "` + text + `"` }

// BaseJump is a rule in a built-in chain that sends traffic to one of a
// backend's chains. Its comment names the backend, so that the backend
// (and kube-proxy, whose comments the iptables backend shares) finds its
// own jumps again among other tools' rules.
type BaseJump struct {
	// Table and Chain are where the rule goes: a built-in chain.
	Table, Chain string
	// Match comes before the comment ("-m conntrack --ctstate NEW"); empty
	// for none.
	Match string
	// Comment is empty for a jump that has none: the kubelet's jumps to
	// KUBE-FIREWALL, which kube-proxy writes as the kubelet does.
	Comment string
	Target  string
}

// Args are the rule's words after "-A <chain>", as restore input.
func (j BaseJump) Args() string {
	a := "-j " + j.Target
	if j.Comment != "" {
		a = Comment(j.Comment) + " " + a
	}
	if j.Match != "" {
		a = j.Match + " " + a
	}
	return a
}

// HasJump reports whether the table holds the base jump j: a rule in its
// built-in chain with its target and comment, however iptables-save
// orders and respells the matches.
func (t *SavedTable) HasJump(j BaseJump) bool {
	for _, r := range t.ChainRules(j.Chain) {
		if RuleArg(r, "-j") == j.Target && RuleArg(r, "--comment") == j.Comment {
			return true
		}
	}
	return false
}

// MissingJumps returns the jumps of table that saved (nil: the table could
// not be read, so all of them) lacks.
func MissingJumps(table string, jumps []BaseJump, saved *SavedTable) []BaseJump {
	var out []BaseJump
	for _, j := range jumps {
		if j.Table == table && !saved.HasJump(j) {
			out = append(out, j)
		}
	}
	return out
}

// RestoreInput writes the body of one table's iptables-restore --noflush
// input, a line at a time. Declaring a chain creates it or flushes it;
// chains not declared are left as they are.
type RestoreInput struct{ line func(string) }

// WriteRestore calls line with each line of the restore input of table:
// its header, what body writes, and the COMMIT that ends it. It never
// holds the input in memory at once (a large table's is tens of MB).
func WriteRestore(table string, line func(string), body func(RestoreInput)) {
	line("*" + table)
	body(RestoreInput{line: line})
	line("COMMIT")
}

// Restore is the restore input WriteRestore writes, each line ended by a
// newline.
func Restore(table string, body func(RestoreInput)) []byte {
	var b bytes.Buffer
	WriteRestore(table, func(l string) { b.WriteString(l); b.WriteByte('\n') }, body)
	return b.Bytes()
}

// Declare creates the chain, or flushes it if it exists.
func (w RestoreInput) Declare(chain string) { w.line(":" + chain + " - [0:0]") }

// InsertJump puts j first in its built-in chain.
func (w RestoreInput) InsertJump(j BaseJump) { w.line("-I " + j.Chain + " " + j.Args()) }

// Rule writes one rule line as it is ("-A <chain> ...").
func (w RestoreInput) Rule(l string) { w.line(l) }

// Rules writes rule lines as they are.
func (w RestoreInput) Rules(ls []string) {
	for _, l := range ls {
		w.line(l)
	}
}

// DeleteRule deletes a rule as ParseSave read it ("-A", chain, ...).
func (w RestoreInput) DeleteRule(saved []string) { w.line("-D " + JoinWords(saved[1:])) }

// DeleteChain deletes the chain, which must be empty and have no jump to
// it left by the time the input commits.
func (w RestoreInput) DeleteChain(chain string) { w.line("-X " + chain) }
