#!/usr/bin/env bash
# Refuses a version that is not a release's, for `make release`:
#   hack/release-check.sh VERSION
# A release is a tag v<major>.<minor>.<patch>, with an optional semver
# pre-release (-rc.1) or build (+meta) part, on a clean tree. The
# Makefile's VERSION is `git describe --tags --always --dirty`, so what it
# prints off a release is refused here: a bare commit (no tag), the tag
# followed by -<n>-g<commit> (commits since the tag), or -dirty
# (uncommitted changes). Those two suffixes are themselves valid semver
# pre-releases, which is why a semver pattern alone would let them through.
#
# RELEASE_ALLOW_DIRTY=1 lets any version through with a warning, for
# trying the release steps on a working tree.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: hack/release-check.sh VERSION" >&2
	exit 2
fi
version=$1

id='[0-9A-Za-z-]+'
semver="^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-$id(\.$id)*)?(\+$id(\.$id)*)?$"
why=""
if [[ ! $version =~ $semver ]]; then
	why="it is not v<major>.<minor>.<patch> (no v0.x.y tag on this commit?)"
elif [[ $version =~ -[0-9]+-g[0-9a-f]{4,}(-dirty)?$ ]]; then
	why="there are commits after the tag (git describe added -<n>-g<commit>)"
fi
if [[ $version == *-dirty ]]; then
	why="${why:+$why, and }the tree has uncommitted changes (git describe added -dirty)"
fi

if [[ -z $why ]]; then
	exit 0
fi
if [[ ${RELEASE_ALLOW_DIRTY:-} == 1 ]]; then
	echo "release: WARNING: releasing VERSION=$version although $why (RELEASE_ALLOW_DIRTY=1)" >&2
	exit 0
fi
echo "release: refusing VERSION=$version: $why." >&2
echo "release: tag a clean commit (git tag v0.x.y) and run make release there, or set RELEASE_ALLOW_DIRTY=1 to try the steps anyway (docs/releasing.md)." >&2
exit 1
