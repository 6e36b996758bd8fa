package iptables

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
)

// savedTable is one table of iptables-save output.
type savedTable struct {
	name string
	// chains are every chain, built-in ones included, in the order saved;
	// chainSet the same as a set.
	chains   []string
	chainSet map[string]bool
	// rules are the "-A" rules, each split into words with the quoting
	// removed ("-A", chain, matches..., "-j", target, ...).
	rules [][]string
}

// parseSave reads iptables-save output (of one table or several).
func parseSave(out []byte) (map[string]*savedTable, error) {
	tables := map[string]*savedTable{}
	var cur *savedTable
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "*"):
			cur = &savedTable{name: l[1:], chainSet: map[string]bool{}}
			tables[cur.name] = cur
		case cur == nil:
			return nil, fmt.Errorf("iptables-save line %d (%q) comes before any table", n, l)
		case l == "COMMIT":
			cur = nil
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			cur.chains = append(cur.chains, name)
			cur.chainSet[name] = true
		default:
			words, err := splitWords(l)
			if err != nil {
				return nil, fmt.Errorf("iptables-save line %d: %w", n, err)
			}
			if len(words) < 2 || words[0] != "-A" {
				return nil, fmt.Errorf("iptables-save line %d (%q) is no rule", n, l)
			}
			cur.rules = append(cur.rules, words)
		}
	}
	return tables, sc.Err()
}

// splitWords splits a rule line as iptables-restore does: on blanks,
// with double quotes grouping and backslash escaping. A word without a
// backslash is a substring of l (its quotes cut off), so the words of a
// large table's rules share the memory of its lines.
func splitWords(l string) ([]string, error) {
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

// hasJump reports whether the table holds the base jump j: a rule in its
// built-in chain with its target and comment, however iptables-save
// orders the matches.
func (t *savedTable) hasJump(j baseJump) bool {
	if t == nil {
		return false
	}
	for _, r := range t.rules {
		if r[1] == j.chain && ruleArg(r, "-j") == j.target && ruleArg(r, "--comment") == j.comment {
			return true
		}
	}
	return false
}

// hasChain reports whether the table has the chain.
func (t *savedTable) hasChain(name string) bool {
	return t != nil && t.chainSet[name]
}

// ruleArg is the word after the first flag in r, "" without one.
func ruleArg(r []string, flag string) string {
	for i := 0; i+1 < len(r); i++ {
		if r[i] == flag {
			return r[i+1]
		}
	}
	return ""
}
