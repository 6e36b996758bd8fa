# Makefile fragment for the cluster tools (kubelet, kube-controller-manager,
# kube-scheduler, kubectl, agnhost, e2e.test, containerd, runc, CNI plugins,
# CoreDNS, pause: docs/cluster-tools.md). The main Makefile includes it;
# `make cluster-tools` builds them once per machine into a shared cache
# directory, and KPR_CLUSTER_TOOLS_DIR tells anything the Makefile runs
# where they are. make test does not build them; the real-cluster targets
# (make cluster-up, make test-cluster-smoke) do, through make cluster-images.

# Keep this default equal to hack/cluster-tools.sh's own (used without
# make), so both find the same build; tests/clustertools checks it.
KPR_CLUSTER_TOOLS_VERSION ?= v1.37.2
KPR_CLUSTER_TOOLS_DIR ?= $(HOME)/.cache/kpr/cluster-tools/$(KPR_CLUSTER_TOOLS_VERSION)
export KPR_CLUSTER_TOOLS_DIR

.PHONY: cluster-tools
cluster-tools:
	./hack/cluster-tools.sh
