#!/usr/bin/env bash
# Prints the packages whose tests need a kernel of their own, comma
# separated, for tests/kernels/run -packages (the Makefile's
# KERNEL_PACKAGES). A package is on the list when one of its test files
# carries the line
#
#	//kpr:kernel-matrix
#
# with a comment saying what in the kernel its tests exercise. The list
# follows the tests instead of being kept by hand: a new kernel-facing
# package joins the matrix by saying so, and one that stops needing a
# kernel leaves it the same way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Hidden directories are left out: .git, and the scratch copies other
# scripts make (hack/generate-check.sh's .generate-check.*).
# (grep would also leave out ".", so the walk starts at the top-level
# entries.) grep finding nothing is handled below.
dirs=$({ grep -rlx --include='*_test.go' --exclude-dir='.*' '//kpr:kernel-matrix' -- * || true; } | xargs -r -n1 dirname | sort -u)
if [[ -z $dirs ]]; then
	echo "kernel-packages: no test file carries //kpr:kernel-matrix; make test-kernels would run nothing" >&2
	exit 1
fi
sed "s|^|./|" <<<"$dirs" | paste -sd, -
