#!/usr/bin/env bash
# Fails when a backend-neutral package depends on the eBPF backend at any
# depth, its tests included. `make lint` runs it beside golangci-lint.
#
# depguard (.golangci.yaml, rule backend-neutral) sees only the imports a
# file writes, so a neutral package importing a neutral-looking one that
# imports maps or cilium/ebpf passes it. This walks `go list -deps -test`
# instead. It reads both lists, which folders are neutral and which packages
# they must not reach, from that depguard rule, so the two checks cannot
# disagree about what "backend-neutral" means.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
config=.golangci.yaml

# The rule's entries, one a line: "file <glob>" for each files: entry and
# "deny <pkg>" for each deny: entry. The rule ends at the first line indented
# no deeper than its own name, a section at the next key beside it.
rule_entries() {
	awk '
		function indent(s) { match(s, /^ */); return RLENGTH }
		/^[[:space:]]*(#|$)/ { next }
		in_rule && indent($0) <= rule_indent { in_rule = 0 }
		/^ *backend-neutral:/ { in_rule = 1; rule_indent = indent($0); section = ""; next }
		!in_rule { next }
		/^ *files:/ { section = "file"; key_indent = indent($0); next }
		/^ *deny:/ { section = "deny"; key_indent = indent($0); next }
		indent($0) <= key_indent && !/^ *- / { section = "" }
		section == "file" && /^ *- / { v = $0; sub(/^ *- */, "", v); gsub(/"/, "", v); print "file " v }
		section == "deny" && /^ *- pkg:/ { v = $0; sub(/^ *- pkg: */, "", v); print "deny " v }
	' "$config"
}

patterns=()
deny=()
while read -r kind value; do
	case $kind in
	file)
		# Only whole folders: a glob this script cannot turn into a package
		# pattern would leave that folder unchecked.
		# shellcheck disable=SC2016 # the literal ${base-path}
		if [[ $value != '${base-path}/'*'/**' ]]; then
			echo "neutral-deps: cannot check $config backend-neutral files entry $value: write it as \"\${base-path}/<folder>/**\"" >&2
			exit 1
		fi
		folder=${value#'${base-path}/'}
		patterns+=("./${folder%/**}/...")
		;;
	deny) deny+=("$value") ;;
	esac
done < <(rule_entries)
if ((${#patterns[@]} == 0 || ${#deny[@]} == 0)); then
	echo "neutral-deps: found no files or no deny entries in $config's backend-neutral rule; has it moved or been renamed?" >&2
	exit 1
fi

# The import graph of every neutral package and its test binaries, one
# package a line: its path, then its imports, tab-separated (test variants'
# paths hold spaces, "p [p.test]").
graph=$(go list -deps -test -f '{{.ImportPath}}{{range .Imports}}{{"\t"}}{{.}}{{end}}' "${patterns[@]}")
# Each package and its test variants ("p [p.test]", "p_test [p.test]"), but
# not the generated test main (p.test), which adds only the testing packages.
roots=$(go list -test -f '{{.ImportPath}}' "${patterns[@]}" | grep -v '\.test$')

# From each root, the shortest chain to every denied package it reaches
# first, in depguard's terms: "x$" denies x itself, "x/" every package under
# it.
report=$(
	awk -F'\t' -v deny="${deny[*]}" -v roots="$roots" '
		function base(p) { sub(/ \[.*\]$/, "", p); return p }
		function denied(p,    i) {
			p = base(p)
			for (i in exact) if (p == exact[i]) return 1
			for (i in prefix) if (index(p, prefix[i]) == 1) return 1
			return 0
		}
		BEGIN {
			n = split(deny, d, " ")
			for (i = 1; i <= n; i++) {
				if (d[i] ~ /\$$/) exact[i] = substr(d[i], 1, length(d[i]) - 1)
				else prefix[i] = d[i]
			}
		}
		{ for (i = 2; i <= NF; i++) adj[$1, ++deg[$1]] = $i }
		END {
			nr = split(roots, r, "\n")
			# Packages first, then their test variants, so that a chain only
			# the tests add is told apart.
			for (k = 1; k <= 2 * nr; k++) {
				root = r[(k - 1) % nr + 1]
				if ((k <= nr) == (root ~ / \[/)) continue
				delete parent; delete queue
				head = 1; tail = 1; queue[1] = root; parent[root] = ""
				while (head <= tail) {
					p = queue[head++]
					if (p != root && denied(p)) {
						chain = base(p)
						for (q = parent[p]; q != ""; q = parent[q]) chain = base(q) " -> " chain
						if (!(chain in told)) print chain (k > nr ? " (in its tests)" : "")
						told[chain] = 1
						continue
					}
					for (i = 1; i <= deg[p]; i++) {
						c = adj[p, i]
						if (!(c in parent)) { parent[c] = p; queue[++tail] = c }
					}
				}
			}
		}
	' <<<"$graph" | sort -u
)
if [[ -n $report ]]; then
	echo "neutral-deps: backend-neutral packages (${patterns[*]}) reach the eBPF backend:" >&2
	echo "$report" | sed 's/^/  /' >&2
	echo "neutral-deps: reach it through an interface or callback the eBPF backend supplies from cmd/kpr, as metrics.SockCounts does" >&2
	exit 1
fi
