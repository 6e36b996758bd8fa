# Makefile fragment for the test tools (kube-apiserver, kube-proxy, etcd).
# The main Makefile includes it; `make tools` builds them once per machine
# into a shared cache directory, and KPR_TOOLS_DIR tells tests/cluster (and
# anything else the Makefile runs) where they are.

# Keep this default equal to hack/tools.sh's own (used by a plain `go test`
# without make), so both find the same build.
KPR_TOOLS_VERSION ?= v1.37.2
KPR_TOOLS_DIR ?= $(HOME)/.cache/kpr/tools/$(KPR_TOOLS_VERSION)
export KPR_TOOLS_DIR

.PHONY: tools
tools:
	./hack/tools.sh
