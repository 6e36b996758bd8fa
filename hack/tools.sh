#!/usr/bin/env bash
# Builds the test tools (kube-apiserver, kube-proxy, etcd) from the
# tests/tools Go module into a cache directory outside the repo and prints
# that directory on stdout (progress goes to stderr).
#
# The directory defaults to ~/.cache/kpr/tools/<kubernetes version> so every
# checkout and every CI run on the same machine shares one build; set
# KPR_TOOLS_DIR to put it elsewhere. A build is skipped when all binaries are
# there and were built from the current inputs (tests/tools and this script,
# recorded in a stamp file), and a flock keeps two concurrent callers (say, two test
# packages started by one `go test ./...`) from building over each other.
set -euo pipefail

KUBE_VERSION=v1.37.2
TOOLS=(kube-apiserver kube-proxy etcd)

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module_dir="$repo_root/tests/tools"
tools_dir=${KPR_TOOLS_DIR:-${HOME:-/root}/.cache/kpr/tools/$KUBE_VERSION}

log() { echo "hack/tools.sh: $*" >&2; }

# Everything the binaries are built from; a change to any of them (a
# version bump, a new ldflag) makes the cached build stale.
stamp=$(cd "$repo_root" && cat tests/tools/go.mod tests/tools/go.sum tests/tools/etcd/main.go hack/tools.sh | sha256sum | cut -d' ' -f1)

all_built() {
	local t
	for t in "${TOOLS[@]}"; do
		[[ -x "$tools_dir/$t" ]] || return 1
	done
	[[ "$(cat "$tools_dir/.stamp" 2>/dev/null)" == "$stamp" ]]
}

if all_built; then
	echo "$tools_dir"
	exit 0
fi

mkdir -p "$tools_dir"
exec 9>"$tools_dir/.build.lock"
if ! flock -n 9; then
	log "another build of $tools_dir is running; waiting for it"
	flock 9
fi

# The build we waited for may have produced everything already.
if all_built; then
	echo "$tools_dir"
	exit 0
fi

log "building kube-apiserver, kube-proxy ($KUBE_VERSION) and etcd into $tools_dir (a few minutes on a fresh machine)"
start=$SECONDS
# Build into a scratch directory and move the binaries in only when all of
# them built, so an interrupted build never leaves a half set that all_built
# would take as complete.
scratch=$(mktemp -d "$tools_dir/.build.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
(
	cd "$module_dir"
	# -trimpath keeps the binaries independent of where the repo lives; no
	# debug info is needed for tools we only run. The -X flags stamp the
	# release the way Kubernetes' own build does, so /version and
	# --version report v1.37.2 rather than v0.0.0-master.
	export CGO_ENABLED=0 GOWORK=off
	minor=${KUBE_VERSION#v1.}
	minor=${minor%%.*}
	version_flags=""
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		version_flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	go build -trimpath -ldflags="-s -w$version_flags" -o "$scratch/" \
		k8s.io/kubernetes/cmd/kube-apiserver \
		k8s.io/kubernetes/cmd/kube-proxy
	go build -trimpath -ldflags='-s -w' -o "$scratch/etcd" ./etcd
)
for t in "${TOOLS[@]}"; do
	mv -f "$scratch/$t" "$tools_dir/$t"
done
echo "$stamp" >"$tools_dir/.stamp"
log "built in $((SECONDS - start))s"
echo "$tools_dir"
