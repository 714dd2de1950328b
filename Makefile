# nomad-device-zfs. `make help` lists the targets.
SHELL        := /bin/bash
GO           ?= go
MODULE       := github.com/nomad-device-zfs/nomad-device-zfs
# VERSION and COMMIT come from the git tag (dist/version, one place for
# `build` and `dist`): tag v0.3.0 gives 0.3.0, 3 commits later 0.3.0+3.g1a2b3c4,
# no tag 0.0.0-dev+g1a2b3c4. Worked out once, and only by targets that use them.
VCS           = $(eval VCS := $$(shell $$(GO) -C dist run ./cmd/version))$(VCS)
VERSION      ?= $(word 1,$(VCS))
COMMIT       ?= $(word 2,$(VCS))
DIST_OUT     ?= $(CURDIR)/dist/out
# -s -w: no symbol table or DWARF in the binary (a third of its size;
# panics still print their stacks), as in the release packages.
LDFLAGS       = -s -w -X $(MODULE)/internal/version.Version=$(VERSION) -X $(MODULE)/internal/version.Commit=$(COMMIT)
STATICCHECK  := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TOOLS        := $(CURDIR)/bin/tools

.PHONY: help build dist test deps bench lint proto demo nomad clean test-openzfs bench-openzfs

help: ## list the targets
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/nomad-device-zfs (drop it into a Nomad client's plugin_dir)
	$(if $(VERSION),,$(error cannot work out the version: see the error above))
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/nomad-device-zfs ./cmd/nomad-device-zfs

dist: ## release files in dist/out (DIST_OUT=dir): linux/amd64 and arm64 zip, .deb, .rpm, SHA256SUMS
	$(GO) -C dist run ./cmd/dist -repo $(CURDIR) -out $(DIST_OUT)

deps: ## as root: install zfs-fuse when no ZFS is present, and build the pinned Nomad (cached)
	bash scripts/ensure-zfs.sh
	bash scripts/build-nomad.sh >/dev/null

test: deps ## run every test: unit, real pool, real gRPC, real Nomad agent (as root)
	$(GO) test -p 1 -count=1 -timeout 45m ./...
	$(GO) -C dist test -count=1 ./...

bench: deps ## as root: the plugin against zfs floors on real pools (10/100/900 slots), then the churn of short jobs on a real Nomad agent against the same jobs without a device; then the data following a job and golden-source slots, then 200 runs of periodic jobs with archive and backup_dir; prints tables, writes bench/*results.json
	$(GO) run ./bench/cmd/zfsbench -out bench/results.json
	$(GO) run ./bench/cmd/zfsbench -churn -churn-out bench/churn-results.json
	$(GO) run ./bench/cmd/zfsbench -mobility -reps 5 -mobility-out bench/mobility-results.json
	$(GO) run ./bench/cmd/zfsbench -golden -reps 9 -golden-out bench/golden-results.json
	$(GO) run ./bench/cmd/zfsbench -periodic -reps 5 -periodic-out bench/periodic-results.json

# The OpenZFS kernel module, in a QEMU VM (scripts/openzfs-vm, docs/testing-openzfs.md).
ZFS          ?= 2.3
TESTS        ?= all

test-openzfs: ## as root: the tests in a VM with the OpenZFS kernel module; ZFS=2.3|2.1|all, TESTS=all|ci|"./pkg ..." (image cached in /var/tmp/nomad-device-zfs-openzfs)
	bash scripts/openzfs-vm/run-go.sh test $(ZFS) '$(TESTS)'

bench-openzfs: ## as root: make bench's runs (sizes, mobility, golden, churn) in the OpenZFS VM (ZFS=2.3|2.1|all, BENCHFLAGS, default -sizes 10,100); writes bench/out/openzfs-<ZFS>/
	bash scripts/openzfs-vm/run-go.sh bench $(ZFS)

lint: ## gofmt, go vet, staticcheck, and the generated protocol code up to date with its .proto files
	@out=$$(gofmt -l cmd internal e2e bench dist); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	bash scripts/gen-proto.sh --check
	$(GO) vet ./...
	$(GO) -C dist vet ./...
	GOBIN=$(TOOLS) $(GO) install $(STATICCHECK)
	$(TOOLS)/staticcheck ./...

proto: ## regenerate internal/nomadproto's Go files from its .proto files (protoc from Debian, generators pinned)
	bash scripts/gen-proto.sh

demo: ## as root: sandbox pool + Nomad dev agent + the example job; KEEP=1 keeps it running
	bash scripts/demo.sh

nomad: ## build the pinned Nomad agent and print its path
	@bash scripts/build-nomad.sh

clean: ## remove build output
	rm -rf bin dist/out
