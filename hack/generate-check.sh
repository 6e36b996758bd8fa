#!/usr/bin/env bash
# Regenerates the BPF objects in a scratch copy of bpf/ and compares them
# with the committed ones: `make generate` must reproduce them byte for byte.
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The copy stays inside the module so bpf2go resolves from go.mod; the
# leading dot keeps ./... patterns from seeing it.
copy="$repo_root/.generate-check.$$"
trap 'rm -rf "$copy"' EXIT
cp -r "$repo_root/bpf" "$copy"
# Only what the fresh build writes may be there to compare.
rm -f "$copy"/*_bpfel.o "$copy"/*_bpfel.go
(cd "$copy" && KPR_BPF_MULTIARCH=$("$repo_root/hack/multiarch.sh") go generate ./... >/dev/null)
status=0
# Every object bpf/gen.go builds (one pair per bpf2go line), from the fresh
# build's side too, so that a new object nobody committed is caught.
shopt -s nullglob
for name in $( (cd "$repo_root/bpf" && printf '%s\n' *_bpfel.o *_bpfel.go; cd "$copy" && printf '%s\n' *_bpfel.o *_bpfel.go) | sort -u); do
	if [[ ! -f $repo_root/bpf/$name ]]; then
		echo "generate-check: bpf/$name is built by 'make generate' but not committed; run it and commit the result" >&2
		status=1
	elif [[ ! -f $copy/$name ]]; then
		echo "generate-check: bpf/$name is committed but no bpf2go line in bpf/gen.go builds it; remove it" >&2
		status=1
	elif ! cmp -s "$repo_root/bpf/$name" "$copy/$name"; then
		echo "generate-check: bpf/$name differs from a fresh 'make generate'; run it and commit the result" >&2
		status=1
	fi
done
[[ $status -eq 0 ]] && echo "generate-check: BPF objects match a fresh build"
exit $status
