# kpr — see README.md. `make demo` runs the main job, `make test` the tests.
SHELL := /bin/bash
GO ?= go
GOFLAGS_TEST ?= -count=1 -timeout 45m
export GOFLAGS := -buildvcs=false

-include tests/tools/tools.mk
-include tests/clustertools/clustertools.mk

.PHONY: all build image cluster-images cluster-up cluster-down cluster-kpr-images test-cluster-smoke test-cluster-operations test-cluster-docs test-cluster-e2e test-cluster release release-check deps generate generate-check lint test unit test-kernels test-kernel-oldest test-kernels-e2e bench bench-proxies bench-plots bench-controlplane bench-dataplane bench-tc demo clean

all: build

# VERSION is stamped into the binary (`kpr --version`); the image build
# passes the same value as its VERSION build argument.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS_VERSION := -X main.version=$(VERSION)

## build: the kpr binary into bin/ (no clang needed: the BPF objects are
## committed). Static (kpr needs no cgo) and -trimpath, as the Dockerfile
## builds it: one binary runs on the host, in `make image` and in the image.
KPR_BIN ?= bin/kpr
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS_VERSION)' -o $(KPR_BIN) ./cmd/kpr

## image: the node image as an OCI archive (an OCI image layout in a tar,
## IMAGE_ARCHIVE), built without a container daemon: the runtime from
## Debian's packages (hack/image-rootfs.sh: iptables nft and legacy, ipset,
## conntrack, sh and mount) and bin/kpr, by hack/image (go-containerregistry).
## Load it with `skopeo copy oci-archive:bin/kpr-image.tar ...`, `podman
## load` or `docker load`. hack/image's test runs it with its own paths.
IMAGE_ARCHIVE ?= bin/kpr-image.tar
IMAGE_ROOTFS ?= bin/image-rootfs
IMAGE_REF ?= ghcr.io/kpr-io/kpr:$(VERSION)
image: build
	rm -rf $(IMAGE_ROOTFS)
	hack/image-rootfs.sh $(IMAGE_ROOTFS)
	cd hack/image && $(GO) run . -rootfs $(abspath $(IMAGE_ROOTFS)) -kpr $(abspath $(KPR_BIN)) \
		-version '$(VERSION)' -ref '$(IMAGE_REF)' -o $(abspath $(IMAGE_ARCHIVE))
	rm -rf $(IMAGE_ROOTFS)

## cluster-images: the container images a real test cluster (kubelet
## v1.37.2, containerd 2.x) needs and cannot pull, as archives for `ctr -n
## k8s.io images import`, named as upstream names them: pause, coredns,
## agnhost, busybox, nginx, glibc-dns-testing, distroless-iptables,
## regression-issue-74839 and kube-proxy (docs/cluster-images.md).
## hack/cluster-images.sh builds their file trees from Debian's packages and
## the binaries pause, coredns and agnhost in KPR_CLUSTER_TOOLS_DIR and
## kube-proxy in KPR_TOOLS_DIR; hack/image/clusterimages writes the archives
## into KPR_CLUSTER_IMAGES_DIR, again only when an input changed.
KPR_CLUSTER_TOOLS_DIR ?= $(HOME)/.cache/kpr/cluster-tools/v1.37.2
KPR_CLUSTER_IMAGES_DIR ?= $(HOME)/.cache/kpr/cluster-images/v1.37.2
cluster-images: tools cluster-tools
	KPR_TOOLS_DIR='$(KPR_TOOLS_DIR)' KPR_CLUSTER_TOOLS_DIR='$(KPR_CLUSTER_TOOLS_DIR)' KPR_CLUSTER_IMAGES_DIR='$(KPR_CLUSTER_IMAGES_DIR)' GO='$(GO)' hack/cluster-images.sh

## cluster-up, cluster-down: a real cluster on this machine (tests/realcluster,
## docs/cluster-e2e.md): the control plane in a network namespace of its own,
## two qemu VMs as nodes with containerd and the kubelet, kpr's image in each
## node's containerd; no kube-proxy and no Service proxy until you install
## one. cluster-up returns once the nodes are Ready and writes
## bin/cluster/kubeconfig; cluster-down removes everything.
CLUSTER_DIR ?= bin/cluster
CHART_APP_VERSION = $(shell sed -n 's/^appVersion: //p' deploy/helm/kpr/Chart.yaml)
CLUSTER_KPR_IMAGE = bin/kpr-image-$(CHART_APP_VERSION).tar
cluster-up: deps tools cluster-images
	$(MAKE) image IMAGE_REF=ghcr.io/kpr-io/kpr:$(CHART_APP_VERSION) IMAGE_ARCHIVE=$(CLUSTER_KPR_IMAGE)
	$(GO) run ./tests/realcluster/cmd/realcluster up -dir $(CLUSTER_DIR) -images $(abspath $(CLUSTER_KPR_IMAGE))

cluster-down:
	$(GO) run ./tests/realcluster/cmd/realcluster down -dir $(CLUSTER_DIR)

## cluster-kpr-images: the two images of kpr the smoke and operations tests
## install and roll to: the chart's appVersion, and a second tag.
cluster-kpr-images:
	$(MAKE) image IMAGE_REF=ghcr.io/kpr-io/kpr:$(CHART_APP_VERSION) IMAGE_ARCHIVE=$(CLUSTER_KPR_IMAGE)
	$(MAKE) image IMAGE_REF=ghcr.io/kpr-io/kpr:v0.1.0-next IMAGE_ARCHIVE=bin/kpr-image-next.tar

## test-cluster-smoke: kpr installed by its chart on a real two-node cluster
## (TestSmoke in tests/realcluster): CoreDNS through kpr, a NodePort from
## outside the nodes, and a rolling update of kpr with no failed request.
## Two images of kpr: the chart's appVersion, and a second tag to roll to.
test-cluster-smoke: deps tools cluster-images cluster-kpr-images
	KPR_CLUSTER_KPR_IMAGE=$(abspath $(CLUSTER_KPR_IMAGE)) KPR_CLUSTER_KPR_NEXT_IMAGE=$(abspath bin/kpr-image-next.tar) \
		$(GO) test -count=1 -timeout 45m -run '^TestSmoke$$' -v ./tests/realcluster

## test-cluster-operations: item 4 of the real-cluster issue (TestOperations
## in tests/realcluster): the migration from kubeadm's kube-proxy (nftables)
## to kpr node by node as docs/migration.md says, a rolling update, a kpr
## pod deleted, a backend scaled down and up, and the way back, while pods
## and a client outside the nodes send every 10 ms and hold connections.
test-cluster-operations: deps tools cluster-images cluster-kpr-images
	KPR_CLUSTER_OPERATIONS=1 KPR_CLUSTER_KPR_IMAGE=$(abspath $(CLUSTER_KPR_IMAGE)) KPR_CLUSTER_KPR_NEXT_IMAGE=$(abspath bin/kpr-image-next.tar) \
		$(GO) test -count=1 -timeout 100m -run '^TestOperations$$' -v ./tests/realcluster

## test-cluster-docs: every sh block of docs/quickstart.md, in order, on a
## real cluster that starts as kubeadm's does, with kube-proxy and CoreDNS
## (TestQuickstart in tests/realcluster): the page cannot rot.
test-cluster-docs: deps tools cluster-images cluster-kpr-images
	KPR_CLUSTER_DOCS=1 KPR_CLUSTER_KPR_IMAGE=$(abspath $(CLUSTER_KPR_IMAGE)) \
		$(GO) test -count=1 -timeout 60m -run '^TestQuickstart$$' -v ./tests/realcluster

## test-cluster: everything on the real cluster: the smoke test, the quick
## start, the operations under traffic, and upstream's e2e selection
## (tests/realcluster: TestE2E, E2EFocus) three times, each on a cluster of
## its own: kube-proxy as kubeadm installs it in nftables mode (the
## reference), kpr (eBPF), and kpr in iptables mode. Each run's JUnit
## report (bin/e2e/) goes into its proxy's record (docs/cluster-e2e/) as
## soon as the run ends, and docs/cluster-e2e.md is written from the
## records (cmd/e2edoc). A full run makes the records anew; E2E_FOCUS (a
## --focus, without $) runs part of the selection and E2E_RESUME=1 only
## what each record lacks (E2E_RESUME=failed: and what failed), both
## adding to the records, since a run on emulated nodes outlasts a
## sitting. test-cluster-e2e runs only this part.
E2E_FOCUS ?=
E2E_RESUME ?=
## E2E_TIMEOUT (a Go duration) ends each run early, with the report of
## what ran by then.
E2E_TIMEOUT ?=
## E2E_PROXIES are the columns, in order.
E2E_PROXIES ?= kube-proxy kpr kpr-iptables
E2E_DIR = bin/e2e
E2E_RECORDS = docs/cluster-e2e
E2EDOC = $(GO) run ./tests/realcluster/cmd/e2edoc -selection $(E2E_DIR)/selection.json -records $(E2E_RECORDS)
test-cluster: test-cluster-smoke test-cluster-docs test-cluster-operations test-cluster-e2e
test-cluster-e2e: deps tools cluster-images cluster-kpr-images
	rm -rf $(E2E_DIR) && mkdir -p $(E2E_DIR)
	$(E2EDOC) -select -tools '$(KPR_CLUSTER_TOOLS_DIR)'
	start=$$(date +%s); \
	for proxy in $(E2E_PROXIES); do \
		focus='$(E2E_FOCUS)'; \
		if [ -n '$(E2E_RESUME)' ]; then \
			focus=$$($(E2EDOC) -missing $$proxy $(if $(filter failed,$(E2E_RESUME)),-failed)) || exit 1; \
			if [ -z "$$focus" ]; then echo "$$proxy: its record has a result for every test"; continue; fi; \
		fi; \
		KPR_CLUSTER_E2E_PROXY=$$proxy KPR_CLUSTER_E2E_REPORT=$(abspath $(E2E_DIR))/$$proxy.xml \
		KPR_CLUSTER_KPR_IMAGE=$(abspath $(CLUSTER_KPR_IMAGE)) KPR_CLUSTER_E2E_FOCUS="$$focus" KPR_CLUSTER_E2E_TIMEOUT='$(E2E_TIMEOUT)' \
			$(GO) test -count=1 -timeout 12h -run '^TestE2E$$' -v ./tests/realcluster || exit 1; \
		$(E2EDOC) -o docs/cluster-e2e.md $(if $(E2E_FOCUS)$(E2E_RESUME),,-replace) \
			-run "$$(date -u +%F) $$(git describe --always --dirty)" $$proxy=$(E2E_DIR)/$$proxy.xml || exit 1; \
	done; \
	$(E2EDOC) -o docs/cluster-e2e.md -took "$$(( ($$(date +%s) - start) / 60 )) minutes"

## release: a versioned release in RELEASE_DIR (docs/releasing.md), every
## file stamped with VERSION, the tag v0.x.y: the static binary
## (kpr-linux-<arch>, as make build), the image archive (make image, tagged
## and labelled VERSION), the chart packaged with version 0.x.y and
## appVersion v0.x.y (tests/deploy/helm/package-chart, Helm's Go library;
## the committed Chart.yaml is left as it is), and SHA256SUMS of the three.
## release-check refuses a VERSION that is not a tag on a clean tree
## (hack/release-check.sh), before anything is built, unless
## RELEASE_ALLOW_DIRTY=1, for a trial (then an untagged VERSION gives the
## chart version 0.0.0-VERSION). The binary and image are of this machine's
## architecture: hack/image-rootfs.sh takes Debian's packages of it.
RELEASE_DIR ?= dist/$(VERSION)
RELEASE_ARCH = $(shell $(GO) env GOARCH)
release: release-check
	rm -rf $(RELEASE_DIR)
	mkdir -p $(RELEASE_DIR)
	$(MAKE) --no-print-directory image VERSION='$(VERSION)' \
		KPR_BIN=$(RELEASE_DIR)/kpr-linux-$(RELEASE_ARCH) IMAGE_ARCHIVE=$(RELEASE_DIR)/kpr-image-linux-$(RELEASE_ARCH).tar
	cd tests/deploy/helm && $(GO) run ./package-chart -chart $(abspath deploy/helm/kpr) -version '$(VERSION)' -o $(abspath $(RELEASE_DIR)) \
		-dev=$(if $(filter 1,$(RELEASE_ALLOW_DIRTY)),true,false)
	cd $(RELEASE_DIR) && sha256sum kpr-linux-$(RELEASE_ARCH) kpr-image-linux-$(RELEASE_ARCH).tar kpr-*.tgz >SHA256SUMS
	@echo "release: $(RELEASE_DIR):" && cat $(RELEASE_DIR)/SHA256SUMS

release-check:
	@hack/release-check.sh '$(VERSION)'

## deps: Debian packages the BPF build and the tests need (only what is missing)
deps:
	@hack/deps.sh

## generate: rebuild the BPF objects and their Go bindings with bpf2go
generate: deps
	cd bpf && KPR_BPF_MULTIARCH=$$(../hack/multiarch.sh) $(GO) generate ./...

## generate-check: fail if the committed BPF objects differ from a fresh build
generate-check: deps
	@hack/generate-check.sh

## lint: golangci-lint with .golangci.yaml (go vet, gofmt, goimports, unused,
## misspell, and depguard keeping the backend-neutral packages off the eBPF
## packages); hack/golangci-lint.sh installs the pinned version on first use.
## The gofmt line also covers the tests/tools module, which golangci-lint does
## not load. hack/neutral-deps.sh checks what depguard cannot: that no
## backend-neutral package reaches the eBPF packages at any depth.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	hack/golangci-lint.sh run ./...
	hack/neutral-deps.sh

## unit: every test that needs neither root nor the API server (-short
## skips the others, see harness.RequireRoot and cluster.StartForTest)
unit:
	$(GO) test -short $(GOFLAGS_TEST) ./...

## test: everything CI runs: generated-code check, lint, all tests (root tests need root), the 5.10 and IPVS VMs.
## Not the real-cluster smoke test (make test-cluster-smoke): on a fresh
## machine it needs make cluster-tools (16 minutes) and 7 minutes of its
## own on top of this target's 57, past the 60 its issue allows
## (docs/test-cluster.md says what does fit).
test: deps generate-check lint tools
	$(GO) test $(GOFLAGS_TEST) ./...
	cd tests/deploy/kustomize && $(GO) test $(GOFLAGS_TEST) ./...
	cd tests/deploy/helm && $(GO) test $(GOFLAGS_TEST) ./...
	cd tests/bench/plot && $(GO) test $(GOFLAGS_TEST) ./...
	cd hack/image && $(GO) test $(GOFLAGS_TEST) ./...
	$(MAKE) test-kernel-oldest
	$(MAKE) test-kernels-e2e

## KERNEL_PACKAGES: the kernel-facing suites that run inside the VMs: every
## package with a test file carrying //kpr:kernel-matrix (hack/kernel-packages.sh).
## The API-server suites stay on the host: they skip inside.
KERNEL_PACKAGES ?= $(shell hack/kernel-packages.sh)
kernel_packages = $(or $(KERNEL_PACKAGES),$(error KERNEL_PACKAGES is empty: hack/kernel-packages.sh found no kernel-facing test package))

## test-kernels: the kernel-facing suites inside qemu VMs on Debian's 5.10
## (bullseye), 6.1 (bookworm) and 6.12 (trixie) kernels, fetched with a
## private apt configuration and cached in ~/.cache/kpr/kernels; the summary
## goes to docs/kernel-matrix.md (tests/kernels/run, hack/kernels.sh)
KERNEL_MATRIX_FLAGS ?=
test-kernels: deps
	$(GO) run ./tests/kernels/run -kernels bullseye,bookworm,trixie -packages $(kernel_packages) -out docs/kernel-matrix.md $(KERNEL_MATRIX_FLAGS)

## test-kernel-oldest: the same on 5.10 only, the oldest kernel kpr
## supports; part of make test. Under emulation on a busy 2-core machine the
## tcnat suite alone can take 20 minutes and the whole VM more than the
## runner's default 40, hence 55.
test-kernel-oldest: deps
	$(GO) run ./tests/kernels/run -kernels bullseye -packages $(kernel_packages) -timeout 55m $(KERNEL_MATRIX_FLAGS)

## test-kernels-e2e: tests/e2e's IPVS-mode scenarios (TestServices/ipvs,
## explain and status in that mode, TestExplainIPVS/ipvs, connects
## during endpoint churn, TestEndpointChurnLeavesNoConnectUntranslated/ipvs,
## UDP resolvers through server cycling and restarts, TestUDPChurn/ipvs,
## and the move to nftables and back, TestModeSwitchIPVSNFTables/ipvs), which
## need ip_vs and dummy links the host may lack, in a 6.1 (bookworm) VM that
## carries kube-apiserver and etcd (about 3 minutes under TCG; part of make
## test, so CI runs the e2e suite in every mode; docs/kernel-matrix.md)
KERNEL_E2E_RUN ?= ^(TestServices|TestExplainIPVS|TestEndpointChurnLeavesNoConnectUntranslated|TestUDPChurn|TestModeSwitchIPVSNFTables)$$/^ipvs$$
test-kernels-e2e: deps tools
	$(GO) run ./tests/kernels/run -kernels bookworm -packages ./tests/e2e -run '$(KERNEL_E2E_RUN)' -timeout 60m $(KERNEL_MATRIX_FLAGS)

## bench: kpr against upstream kube-proxy (docs/benchmarks.md), the control
## plane (docs/control-plane-performance.md), connect() through the socket
## LB (docs/dataplane-benchmark.md) and NodePort requests from outside through
## the tc programs against iptables (docs/tc-dataplane.md)
bench: bench-proxies bench-controlplane bench-dataplane bench-tc

bench-proxies: deps tools
	$(GO) test ./tests/bench -run '^TestProxyBenchmark$$' -count=1 -v -timeout 3h -args \
		-sizes=100,1000,10000 -updates=200 -samples=2000 -out=docs/bench -doc=docs/benchmarks.md
	$(MAKE) bench-plots

## bench-plots: redraw the PNG plots in BENCH_OUT from its results.json
## (tests/bench/plot, a module of its own so that the plotting libraries stay
## out of kpr's go.mod)
BENCH_OUT ?= docs/bench
bench-plots:
	cd tests/bench/plot && $(GO) run . -results $(abspath $(BENCH_OUT))/results.json -out $(abspath $(BENCH_OUT))

bench-controlplane: deps tools
	$(GO) test ./tests/syncperf -run '^$$' -bench . -benchtime 1x -count=1 -timeout 1h

## bench-dataplane: what the socket hooks add to connect(), and requests per
## second from a pod through a ClusterIP on each path of --socket-lb per-pod
## (the packet path, the socket hooks, a direct connection) against
## kube-proxy-style iptables rules, 1,000 Services (docs/dataplane-benchmark.md)
bench-dataplane: deps
	$(GO) test ./tests/socklb -run '^$$' -bench Connect -benchtime 5000x -count 3
	$(GO) test ./tests/tcnat -run '^$$' -bench PodClusterIPRequests -benchtime 1x -count=1 -timeout 30m

## bench-tc: requests per second and latency through a NodePort, kpr's tc
## programs against kube-proxy-style iptables rules (legacy and nft), each in
## an identical topology of its own, alternating in one run, 1,000 Services;
## then BPF time per packet of an established flow, net of the harness;
## then the same sides under a spoofed SYN flood (500 to 5,000 SYN/s, 60 s
## each) with remote backends, its results written into docs/tc-dataplane.md
bench-tc: deps
	$(GO) test ./tests/tcnat -run '^$$' -bench NodePortRequests -benchtime 1x -count=1 -timeout 30m
	$(GO) test ./tests/tcnat -run '^$$' -bench PerPacket -benchtime 100000x -count 3
	$(GO) test ./tests/tcnat -run '^$$' -bench NodePortHostile -benchtime 1x -count=1 -timeout 60m -args -tchostile.doc=$(CURDIR)/docs/tc-dataplane.md

## demo: a local API server, three pods, a Service and kpr run, end to end
demo: deps tools build
	$(GO) run ./tests/demo

clean:
	rm -rf bin
