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
(cd "$copy" && KPR_BPF_MULTIARCH=$("$repo_root/hack/multiarch.sh") go generate ./... >/dev/null)
status=0
for f in "$repo_root"/bpf/*_bpfel.o "$repo_root"/bpf/*_bpfel.go; do
	if ! cmp -s "$f" "$copy/$(basename "$f")"; then
		echo "generate-check: $(basename "$f") differs from a fresh 'make generate'; run it and commit the result" >&2
		status=1
	fi
done
[[ $status -eq 0 ]] && echo "generate-check: BPF objects match a fresh build"
exit $status
