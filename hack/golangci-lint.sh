#!/usr/bin/env bash
# Runs golangci-lint (config: .golangci.yaml) with its arguments, installing
# the pinned version first when it is not cached. `make lint` (and so `make
# test`) calls it, so a fresh machine needs nothing but Go and the module
# proxy.
#
# The binary lives in ~/.cache/kpr/golangci-lint/<version> (set
# KPR_GOLANGCI_LINT_DIR to put it elsewhere), outside the repo so every
# checkout on the machine shares it. The stamp records the version and the Go
# that built it: golangci-lint refuses code whose go directive is newer than
# its own Go, so a Go upgrade reinstalls as a version bump does.
set -euo pipefail

VERSION=v2.15.0
PKG=github.com/golangci/golangci-lint/v2/cmd/golangci-lint

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${KPR_GOLANGCI_LINT_DIR:-${HOME:-/root}/.cache/kpr/golangci-lint/$VERSION}
bin=$dir/golangci-lint
stamp="$VERSION $(go env GOVERSION)"

log() { echo "hack/golangci-lint.sh: $*" >&2; }

installed() {
	[[ -x "$bin" && "$(cat "$dir/.stamp" 2>/dev/null)" == "$stamp" ]]
}

if ! installed; then
	mkdir -p "$dir"
	exec 9>"$dir/.install.lock"
	if ! flock -n 9; then
		log "another install into $dir is running; waiting for it"
		flock 9
	fi
	if ! installed; then
		log "installing $PKG@$VERSION into $dir (a minute or two on a fresh machine)"
		start=$SECONDS
		# Install into a scratch directory and move the binary in whole, so an
		# interrupted install never leaves a binary the stamp would vouch for.
		scratch=$(mktemp -d "$dir/.install.XXXXXX")
		trap 'rm -rf "$scratch"' EXIT
		# pkg@version ignores the main module; GOWORK=off keeps a go.work from
		# pulling it back in.
		if ! GOBIN=$scratch GOWORK=off go install "$PKG@$VERSION"; then
			log "go install $PKG@$VERSION failed; check that the module proxy ($(go env GOPROXY)) is reachable"
			exit 1
		fi
		mv -f "$scratch/golangci-lint" "$bin"
		echo "$stamp" >"$dir/.stamp"
		rm -rf "$scratch" # the exec below skips the EXIT trap
		log "installed in $((SECONDS - start))s"
	fi
	exec 9>&-
fi

cd "$repo_root"
exec "$bin" "$@"
