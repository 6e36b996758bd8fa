package netfilter

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"github.com/kpr-io/kpr/dataplane"
)

// SavedTable is one table of iptables-save output.
type SavedTable struct {
	Name string
	// Chains are every chain, built-in ones included, in the order saved.
	Chains   []string
	chainSet map[string]bool
	// policies are the built-in chains' policies ("ACCEPT", "DROP").
	policies map[string]string
	// Rules are the "-A" rules, each split into words with the quoting
	// removed ("-A", chain, matches..., "-j", target, ...).
	Rules [][]string
}

// ParseSave reads iptables-save output (of one table or several), with
// the quoting iptables-restore reads: a comment with blanks is one word.
func ParseSave(out []byte) (map[string]*SavedTable, error) {
	tables := map[string]*SavedTable{}
	var cur *SavedTable
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			cur = &SavedTable{Name: l[1:], chainSet: map[string]bool{}, policies: map[string]string{}}
			tables[cur.Name] = cur
		case cur == nil:
			return nil, fmt.Errorf("iptables-save line %d (%q) comes before any table", n, l)
		case l == "COMMIT":
			cur = nil
		case strings.HasPrefix(l, ":"):
			name, rest, _ := strings.Cut(l[1:], " ")
			cur.Chains = append(cur.Chains, name)
			cur.chainSet[name] = true
			if policy, _, _ := strings.Cut(rest, " "); policy != "-" && policy != "" {
				cur.policies[name] = policy
			}
		default:
			words, err := SplitWords(l)
			if err != nil {
				return nil, fmt.Errorf("iptables-save line %d: %w", n, err)
			}
			if len(words) < 2 || words[0] != "-A" {
				return nil, fmt.Errorf("iptables-save line %d (%q) is no rule", n, l)
			}
			cur.Rules = append(cur.Rules, words)
		}
	}
	return tables, sc.Err()
}

// SplitWords splits a rule line as iptables-restore does: on blanks,
// with double quotes grouping and backslash escaping. A word without a
// backslash is a substring of l (its quotes cut off), so the words of a
// large table's rules share the memory of its lines.
func SplitWords(l string) ([]string, error) {
	out := make([]string, 0, strings.Count(l, " ")+1) // at most one word a blank
	var w strings.Builder
	inWord, quoted, escaped := false, false, false
	// start is where the word began in l; plain says it is still a
	// substring of l, from start to the end minus its quotes.
	start, plain := 0, true
	end := func(i int) {
		if plain {
			out = append(out, strings.ReplaceAll(l[start:i], `"`, ""))
		} else {
			out = append(out, w.String())
		}
		w.Reset()
		inWord, plain = false, true
	}
	for i, r := range l {
		if !inWord && r != ' ' && r != '\t' {
			start = i // outside a word nothing is quoted
		}
		switch {
		case escaped:
			w.WriteRune(r)
			escaped = false
		case r == '\\':
			if plain {
				w.WriteString(strings.ReplaceAll(l[start:i], `"`, ""))
				plain = false
			}
			escaped, inWord = true, true
		case r == '"':
			quoted = !quoted
			inWord = true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				end(i)
			}
		default:
			if !plain {
				w.WriteRune(r)
			}
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", l)
	}
	if inWord {
		end(len(l))
	}
	return out, nil
}

// JoinWords is the inverse of SplitWords: words joined with blanks, those
// that need it quoted, for restore input.
func JoinWords(words []string) string {
	out := make([]string, len(words))
	for i, w := range words {
		if strings.ContainsAny(w, " \t\"\\") || w == "" {
			w = `"` + strings.ReplaceAll(strings.ReplaceAll(w, `\`, `\\`), `"`, `\"`) + `"`
		}
		out[i] = w
	}
	return strings.Join(out, " ")
}

// HasChain reports whether the table has the chain; a nil table has none.
func (t *SavedTable) HasChain(name string) bool {
	return t != nil && t.chainSet[name]
}

// ChainRules are the rules of chain, in order; none of a nil table.
func (t *SavedTable) ChainRules(chain string) [][]string {
	if t == nil {
		return nil
	}
	var out [][]string
	for _, r := range t.Rules {
		if r[1] == chain {
			out = append(out, r)
		}
	}
	return out
}

// RuleArg is the word after the first flag in r, "" without one.
func RuleArg(r []string, flag string) string {
	for i := 0; i+1 < len(r); i++ {
		if r[i] == flag {
			return r[i+1]
		}
	}
	return ""
}

// ProtoName is the protocol as iptables (and kube-proxy's chain-name
// hashes) spell it.
func ProtoName(p dataplane.Protocol) string { return strings.ToLower(p.String()) }

// ParseProto reads ProtoName's spelling back; anything else is TCP.
func ParseProto(s string) dataplane.Protocol {
	switch s {
	case "udp":
		return dataplane.UDP
	case "sctp":
		return dataplane.SCTP
	}
	return dataplane.TCP
}
