# nftproxy — see README.md. Targets that touch the kernel need root; they only ever
# program network namespaces they create themselves.
SHELL    := /bin/bash
GO       ?= go
BIN      := $(CURDIR)/bin
PKGS     := ./cmd/... ./internal/... ./nft/... ./manifests/... ./e2e/kind/

.PHONY: all build image release deps test lint unit chart-test manifests e2e kind soak demo bench shapes fuzz conformance kernels clean

all: build

# The version nftproxy reports (--version, nftproxy_build_info, the startup line) comes
# from one place, the VERSION file: the release this tree is, or will be, published as.
# A release (`make release`, or a checkout of its annotated tag) is exactly that version,
# e.g. v0.1.0; any other build is a pre-release of it with the commit,
# v0.1.0-dev.g<short commit>[.dirty]: a valid semantic version and image tag. After a
# release, VERSION moves to the next version (docs/release.md).
RELEASE_VERSION := $(shell tr -d ' \n' < $(CURDIR)/VERSION)
SHORT_COMMIT    := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY           := $(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo .dirty)
VERSION ?= $(shell git describe --exact-match --match '$(RELEASE_VERSION)' HEAD >/dev/null 2>&1 && test -z '$(DIRTY)' && echo '$(RELEASE_VERSION)' || echo '$(RELEASE_VERSION)-dev.g$(SHORT_COMMIT)$(DIRTY)')
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
VPKG    := github.com/nftproxy/nftproxy/internal/version

build:
	$(GO) build -ldflags "-X $(VPKG).gitVersion=$(VERSION) -X $(VPKG).gitCommit=$(COMMIT)" -o $(BIN)/nftproxy ./cmd/nftproxy

# The container image, stamped with the same version (podman, else docker). IMAGE_REPO is
# the name the chart and manifests use; override it to publish elsewhere.
IMAGE_REPO ?= ghcr.io/nftproxy/nftproxy
IMAGE      ?= $(IMAGE_REPO):$(VERSION)
image:
	$$(command -v podman || command -v docker) build -f Containerfile --build-arg VERSION=$(VERSION) --build-arg GIT_COMMIT=$(COMMIT) -t $(IMAGE) .

# A release into DIST, without a container engine and without network (the Go module
# cache is enough): static linux/amd64 and linux/arm64 binaries, the multi-architecture
# image $(IMAGE_REPO):$(RELEASE_VERSION) as one OCI tarball (docker/podman load, ctr
# import, kind load image-archive), a CycloneDX SBOM per binary, SHA256SUMS. Always the
# VERSION file's version; twice gives byte-identical files. docs/release.md.
DIST ?= $(CURDIR)/dist
release:
	e2e/hack/release.sh $(if $(filter command line,$(origin VERSION)),$(VERSION),$(RELEASE_VERSION)) $(DIST) $(IMAGE_REPO)

deps:
	e2e/hack/install-deps.sh

# Everything CI runs.
test: deps lint unit chart-test e2e

lint:
	@unformatted="$$(gofmt -l cmd internal nft e2e manifests)"; if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(BIN)/staticcheck ./...

# Unit tests, including the kernel tests (each in its own throwaway network namespace).
# The Debian roots with other nft versions (internal/compile TestNftVersions) are built
# first, outside the tests' time limit: a few minutes once, cached afterwards.
unit:
	e2e/hack/nft-roots.sh >/dev/null
	NFTPROXY_KERNEL_TESTS=1 $(GO) test -count=1 $(PKGS)

# The Helm chart (charts/nftproxy) and its monitoring files, with helm and promtool
# from bin/ (make deps): lint, render with and without the required values (without
# must fail, naming them), the values schema, the alert rules and their unit tests.
# manifests/ is checked against the chart by `make unit` (manifests_test.go).
HELM     := $(BIN)/helm
PROMTOOL := $(BIN)/promtool
CHART    := charts/nftproxy
chart-test:
	$(HELM) lint --strict $(CHART) --set apiServer.host=192.0.2.1 --set apiServer.port=6443
	$(HELM) template t $(CHART) --set apiServer.host=192.0.2.1 --set apiServer.port=6443 \
		--set serviceMonitor.enabled=true --set podMonitor.enabled=true --set prometheusRule.enabled=true \
		--set dashboards.enabled=true >/dev/null
	@out="$$($(HELM) template t $(CHART) 2>&1)"; rc=$$?; \
		if [ $$rc -eq 0 ] || ! grep -q 'apiServer.host is required' <<<"$$out"; then \
			echo "helm template without apiServer.host: exit $$rc, want a failure naming it:"; echo "$$out"; exit 1; fi; \
		echo "without apiServer.host: $$(grep -o 'apiServer.host is required[^:]*' <<<"$$out")"
	@out="$$($(HELM) template t $(CHART) --set apiServer.host=192.0.2.1 --set apiServer.port=99999 2>&1)"; rc=$$?; \
		if [ $$rc -eq 0 ] || ! grep -q 'values don.t meet the specifications of the schema' <<<"$$out"; then \
			echo "helm template with apiServer.port=99999: exit $$rc, want the schema to refuse it:"; echo "$$out"; exit 1; fi; \
		echo "apiServer.port=99999: refused by values.schema.json"
	$(PROMTOOL) check rules $(CHART)/files/nftproxy.rules.yaml
	$(PROMTOOL) test rules $(CHART)/tests/nftproxy.rules.test.yaml

# manifests/*.yaml from the chart (see manifests/generate.sh).
manifests:
	HELM=$(HELM) manifests/generate.sh

# End-to-end: real etcd + kube-apiserver and real packets between network namespaces.
# One package at a time (-p 1): each runs its own clusters and traffic needs the CPU.
# Includes e2e/realcluster's TestRealClusterSmoke: a real two-node kubelet cluster with
# nftproxy installed with helm from charts/nftproxy, its metrics scraped, and one upstream
# [Conformance] spec (~1.5 min warm), and e2e/release's TestRelease: make release twice,
# compared byte for byte, the binaries checked static, the image imported into a
# throwaway containerd (~1.5 min warm).
e2e:
	NFTPROXY_E2E=1 $(GO) test -count=1 -p 1 -timeout 60m -v ./e2e/...

# A kind cluster (two nodes, kubeProxyMode none, kindnet) in a dockerd of its own inside a
# network namespace of its own, with the release's image loaded, driven by docs/kind.md's
# sh blocks as written, then the checks of a CI job (verify, list -o json against
# docs/schema/list-v1.json, the node's nft). Not part of `make test`: cold (node image,
# Kubernetes binaries and images built offline into /var/cache/nftproxy/kind) about an
# hour, warm about 70 s. kindnetd is built from KIND_SRC, a kubernetes-sigs/kind checkout,
# until it is cached. docs/kind.md.
kind:
	NFTPROXY_KIND=1 KIND_SRC=$(KIND_SRC) $(GO) test -count=1 -timeout 180m -v -run '^TestKind$$' ./e2e/kind/

# Churn soak alone, longer than the 4 minutes it runs within e2e (SOAK_DURATION=… to change).
SOAK_DURATION ?= 30m
soak:
	NFTPROXY_E2E=1 SOAK_DURATION=$(SOAK_DURATION) $(GO) test -count=1 -timeout 3h -v -run '^TestChurnSoak$$' ./e2e/

# The main job on a built-in local cluster: two services, the ruleset, traffic.
demo: deps
	$(GO) run ./e2e/demo

# Go benchmarks, then the side-by-side suite (e2e/bench): nftproxy and kube-proxy v1.37.0
# (nftables and iptables mode) on one local cluster, about an hour at full size; writes
# docs/bench/results.{json,md} and chart.png. Its N=100 smoke runs within `make e2e`.
BENCH_SIZES ?= 1000,10000,30000,5000x50
bench: deps
	mkdir -p docs/bench
	set -o pipefail; NFTPROXY_KERNEL_TESTS=1 $(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/compile/ ./internal/controller/ ./nft/kernel/ | tee docs/bench/gobench.txt
	NFTPROXY_BENCH=1 BENCH_SIZES=$(BENCH_SIZES) $(GO) test -count=1 -timeout 150m -v -run '^TestSideBySide$$' ./e2e/bench/

# Candidate ruleset shapes (docs/shapes.md): kernel CPU per steady-state
# change at 1k–50k services and per new flow, each candidate beside today's ruleset.
shapes: deps
	NFTPROXY_KERNEL_TESTS=1 NFTPROXY_SHAPES_BENCH=1 $(GO) test -count=1 -timeout 60m -v -run '^(TestChangeCost|TestNewFlowCost)$$' ./e2e/bench/shapes/

# Hostile-input fuzzing of the model builder and the compiler, FUZZTIME per target, one
# worker each (internal/controller/fuzz_test.go). `unit` already runs their seed corpus
# (testdata/fuzz) as tests, and applies it to the kernel in throwaway namespaces.
FUZZTIME ?= 30s
FUZZ_TARGETS := FuzzCompile FuzzCompileIncremental FuzzIsolation
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) -parallel=1 ./internal/controller/ || exit 1; \
	done

# Upstream's e2e.test v1.37.0 ([sig-network] Services, Networking, Conntrack, EndpointSlice,
# ...; docs/conformance.md) against real two-node clusters, first with kube-proxy v1.37.0
# (nftables mode) and then with nftproxy from manifests/, each in a fresh cluster; then
# the disruption measurements (docs/reliability.md). Results and the table in
# CONFORMANCE_OUT. The last line is nftproxy's "N passed, N failed".
CONFORMANCE_OUT ?= $(CURDIR)/bin/conformance
conformance: deps
	mkdir -p $(CONFORMANCE_OUT)
	NFTPROXY_E2E=1 NFTPROXY_CONFORMANCE=1 CONFORMANCE_OUT=$(CONFORMANCE_OUT) $(GO) test -count=1 -timeout 5h -v \
		-run '^(TestDisruption|TestConformance)$$' ./e2e/realcluster/ > $(CONFORMANCE_OUT)/go-test.log 2>&1; \
		rc=$$?; grep -E '^(=== RUN|--- |    --- |PASS|FAIL|ok)' $(CONFORMANCE_OUT)/go-test.log; \
		cat $(CONFORMANCE_OUT)/summary.txt 2>/dev/null || echo "no nftproxy results (see $(CONFORMANCE_OUT)/go-test.log)"; exit $$rc

# The kernel tests (all of nft/..., those of the packages above that program a table) and a
# ClusterIP packet test (e2e/kernels) in Debian's 5.10, 6.1 and 6.12 kernels, each booted
# under qemu (software CPU, 1 vCPU, one guest at a time, at most KERNELS_TIMEOUT seconds
# each); prints one line per kernel. Fetches the kernels into /var/cache/nftproxy/kernels
# and installs qemu-system-x86 and busybox-static if missing. Not part of `make test`:
# 35 min here, 9-14 min per kernel. Results in bin/kernels/<release>/; see
# docs/operations.md#kernels-tested.
kernels:
	e2e/hack/kernels.sh

clean:
	rm -rf $(BIN) $(DIST)
