package iptables

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Cleanup removes what the backend writes from the tables of the network
// namespace r runs in: the base jumps in the built-in chains, the shared
// chains and every per-ServicePort chain. It covers both variants and both
// families wherever their binaries run, since the node may have changed
// variant since the rules were written; a variant or family whose
// iptables-save does not run holds nothing kpr could have written, and is
// skipped. The names are kube-proxy's (see names.go), so kube-proxy's own
// iptables-mode chains go too, as under `kube-proxy --cleanup`. It returns
// how many chains it deleted.
func Cleanup(r Runner) (int, error) {
	return RemoveChains(r, tables, func(table, chain string) bool {
		return slices.Contains(sharedChains(table), chain) || ownedChain(chain)
	})
}

// RemoveChains deletes, from the given tables of both variants and both
// families, every chain for which remove(table, chain) is true, and first
// every rule of another chain that jumps to one of them (the base jumps in
// the built-in chains, and any a tool added). A variant or family whose
// iptables-save does not run is skipped. It returns how many chains it
// deleted. `kpr cleanup --kube-proxy` uses it with kube-proxy's chains.
func RemoveChains(r Runner, tables []string, remove func(table, chain string) bool) (int, error) {
	deleted := 0
	var errs []error
	for _, v := range []Variant{NFT, Legacy} {
		for _, fam := range []Family{IPv4, IPv6} {
			tools := ToolsFor(v, fam)
			for _, table := range tables {
				out, err := r.Run(tools.Save, []string{"-t", table}, nil)
				if err != nil {
					continue
				}
				parsed, err := parseSave(out)
				if err != nil {
					errs = append(errs, fmt.Errorf("read the %s %s %s table: %w", v, fam, table, err))
					continue
				}
				input, n := cleanupInput(table, parsed[table], remove)
				if n == 0 && input == nil {
					continue
				}
				if _, err := r.Run(tools.Restore, []string{"--noflush"}, input); err != nil {
					errs = append(errs, fmt.Errorf("remove kpr's chains from the %s %s %s table: %w", v, fam, table, err))
					continue
				}
				deleted += n
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// cleanupInput is the iptables-restore --noflush input that deletes the
// rules of other chains that jump to the chains remove picks, then flushes
// and deletes those chains, and how many chains that is. It is nil when the
// table holds none of it.
func cleanupInput(table string, saved *savedTable, remove func(table, chain string) bool) ([]byte, int) {
	if saved == nil {
		return nil, 0
	}
	var chains []string
	for _, c := range saved.chains {
		if remove(table, c) {
			chains = append(chains, c)
		}
	}
	// Rules in other chains that jump to the removed ones: the base jumps
	// in the built-in chains, and any another tool added; the chains
	// could not be deleted while they stay.
	var jumps [][]string
	for _, rule := range saved.rules {
		if !slices.Contains(chains, rule[1]) && slices.Contains(chains, ruleArg(rule, "-j")) {
			jumps = append(jumps, rule)
		}
	}
	if len(chains) == 0 && len(jumps) == 0 {
		return nil, 0
	}
	var b strings.Builder
	b.WriteString("*" + table + "\n")
	for _, rule := range jumps {
		b.WriteString("-D " + joinWords(rule[1:]) + "\n")
	}
	// Declaring flushes: after that no chain of the set jumps to another,
	// so each can be deleted.
	for _, c := range chains {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	for _, c := range chains {
		b.WriteString("-X " + c + "\n")
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), len(chains)
}

// joinWords is the inverse of splitWords: words joined with blanks, those
// that need it quoted, for restore input.
func joinWords(words []string) string {
	out := make([]string, len(words))
	for i, w := range words {
		if strings.ContainsAny(w, " \t\"\\") || w == "" {
			w = `"` + strings.ReplaceAll(strings.ReplaceAll(w, `\`, `\\`), `"`, `\"`) + `"`
		}
		out[i] = w
	}
	return strings.Join(out, " ")
}
