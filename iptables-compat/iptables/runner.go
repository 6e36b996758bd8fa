package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Runner runs the iptables binaries. The Plane reaches the kernel only
// through it, so tests can give it an in-memory stand-in, or run the real
// binaries inside a network namespace of their own.
type Runner interface {
	// Run runs name with args and stdin, and returns its standard output.
	// A failure's error carries the command's standard error.
	Run(name string, args []string, stdin []byte) ([]byte, error)
}

// ExecRunner runs the binaries as processes. Prefix, when set, comes
// before every command (for example "ip netns exec NAME").
type ExecRunner struct {
	Prefix []string
	// Context, when set, ends the commands: once it is done a running
	// command is killed and no new one starts. A killed iptables-restore
	// has committed nothing, so its table is left as it was; kpr run
	// passes the context that SIGTERM cancels, so that it exits at once
	// rather than after the restore (which can take seconds on a large
	// table).
	Context context.Context
}

func (r ExecRunner) Run(name string, args []string, stdin []byte) ([]byte, error) {
	argv := append(append(append([]string{}, r.Prefix...), name), args...)
	ctx := r.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: not run, kpr is stopping: %w", strings.Join(argv, " "), err)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return stdout.Bytes(), fmt.Errorf("%s: ended, kpr is stopping (%w): %w", strings.Join(argv, " "), err, ctxErr)
		}
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Tools are the binaries of one family.
type Tools struct {
	Save, Restore string
	// SplitLines is the most lines of per-ServicePort chains one restore
	// writes: a larger write goes in several transactions (see
	// tableInput.split). 0 never splits.
	SplitLines int
}

// nftSplitLines bounds an iptables-nft transaction. iptables-nft-restore's
// time grows with the square of a transaction's size: the nat rules of
// 1,000 Services with 10 endpoints each (42,000 lines) take 7 s in one
// restore, of 4,000 Services 413 s, while 4,000 Services in transactions
// of about 4,000 lines take 4 s in all, and 10,000 Services 13 s.
// iptables-legacy-restore is not split: it rewrites the whole table
// whatever the transaction holds, so splitting would multiply its work.
const nftSplitLines = 4000

// Variant is which iptables implementation the node uses.
type Variant string

const (
	NFT    Variant = "nft"
	Legacy Variant = "legacy"
)

// ToolsFor returns the binaries of variant for fam.
func ToolsFor(v Variant, fam Family) Tools {
	base := "iptables"
	if fam == IPv6 {
		base = "ip6tables"
	}
	t := Tools{Save: base + "-" + string(v) + "-save", Restore: base + "-" + string(v) + "-restore"}
	if v == NFT {
		t.SplitLines = nftSplitLines
	}
	return t
}

// DetectVariant decides, as kube-proxy's iptables-wrapper does, whether the
// node's rules live in iptables-nft or iptables-legacy: the one that holds
// more rules is the one the node's other components (kubelet, the CNI
// plugin) use, and kpr must write beside them, not in the other set that
// the kernel also runs. When both are equally empty it asks
// `iptables --version`, which prints "(nf_tables)" or "(legacy)", and
// prefers nft if that does not say.
func DetectVariant(r Runner) (Variant, string, error) {
	nft, nftErr := countRules(r, "iptables-nft-save")
	legacy, legacyErr := countRules(r, "iptables-legacy-save")
	switch {
	case nftErr != nil && legacyErr != nil:
		return "", "", fmt.Errorf("neither iptables-nft-save nor iptables-legacy-save runs (%v; %v): install the iptables package", nftErr, legacyErr)
	case legacyErr != nil:
		return NFT, "iptables-legacy-save does not run", nil
	case nftErr != nil:
		return Legacy, "iptables-nft-save does not run", nil
	case legacy > nft:
		return Legacy, fmt.Sprintf("iptables-legacy holds %d rules, iptables-nft %d", legacy, nft), nil
	case nft > legacy:
		return NFT, fmt.Sprintf("iptables-nft holds %d rules, iptables-legacy %d", nft, legacy), nil
	}
	out, err := r.Run("iptables", []string{"--version"}, nil)
	if err == nil && strings.Contains(string(out), "(legacy)") {
		return Legacy, fmt.Sprintf("no rules in either; `iptables --version` says %q", strings.TrimSpace(string(out))), nil
	}
	return NFT, fmt.Sprintf("no rules in either; `iptables --version` says %q", strings.TrimSpace(string(out))), nil
}

func countRules(r Runner, save string) (int, error) {
	out, err := r.Run(save, nil, nil)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-") {
			n++
		}
	}
	return n, nil
}
