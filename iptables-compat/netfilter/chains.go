package netfilter

import (
	"errors"
	"fmt"
	"slices"
)

// RemoveChains deletes, from the given tables of both variants and both
// families, every chain for which remove(table, chain) is true, and first
// every rule of another chain that jumps to one of them (the base jumps in
// the built-in chains, and any a tool added). It covers both variants,
// since the node may have changed variant since the rules were written; a
// variant or family whose iptables-save does not run holds nothing anyone
// could have written there, and is skipped. It returns how many chains it
// deleted.
func RemoveChains(r Runner, tables []string, remove func(table, chain string) bool) (int, error) {
	deleted := 0
	var errs []error
	for _, v := range Variants {
		for _, fam := range Families {
			tools := ToolsFor(v, fam)
			for _, table := range tables {
				out, err := r.Run(tools.Save, []string{"-t", table}, nil)
				if err != nil {
					continue
				}
				parsed, err := ParseSave(out)
				if err != nil {
					errs = append(errs, fmt.Errorf("read the %s %s %s table: %w", v, fam, table, err))
					continue
				}
				input, n := removalInput(table, parsed[table], remove)
				if input == nil {
					continue
				}
				if _, err := r.Run(tools.Restore, []string{"--noflush"}, input); err != nil {
					errs = append(errs, fmt.Errorf("remove the chains from the %s %s %s table: %w", v, fam, table, err))
					continue
				}
				deleted += n
			}
		}
	}
	return deleted, errors.Join(errs...)
}

// removalInput is the iptables-restore --noflush input that deletes the
// rules of other chains that jump to the chains remove picks, then flushes
// and deletes those chains, and how many chains that is. It is nil when
// the table holds none of it.
func removalInput(table string, saved *SavedTable, remove func(table, chain string) bool) ([]byte, int) {
	if saved == nil {
		return nil, 0
	}
	var chains []string
	for _, c := range saved.Chains {
		if remove(table, c) {
			chains = append(chains, c)
		}
	}
	// Rules in other chains that jump to the removed ones: the base jumps
	// in the built-in chains, and any another tool added; the chains
	// could not be deleted while they stay.
	var jumps [][]string
	for _, rule := range saved.Rules {
		if !slices.Contains(chains, rule[1]) && slices.Contains(chains, RuleArg(rule, "-j")) {
			jumps = append(jumps, rule)
		}
	}
	if len(chains) == 0 && len(jumps) == 0 {
		return nil, 0
	}
	return Restore(table, func(w RestoreInput) {
		for _, rule := range jumps {
			w.DeleteRule(rule)
		}
		// Declaring flushes: after that no chain of the set jumps to
		// another, so each can be deleted.
		for _, c := range chains {
			w.Declare(c)
		}
		for _, c := range chains {
			w.DeleteChain(c)
		}
	}), len(chains)
}
