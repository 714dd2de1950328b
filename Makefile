# nomad-device-zfs. `make help` lists the targets.
SHELL        := /bin/bash
GO           ?= go
MODULE       := github.com/nomad-device-zfs/nomad-device-zfs
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT       ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS      := -X $(MODULE)/internal/device.Version=$(VERSION) -X $(MODULE)/internal/device.Commit=$(COMMIT)
STATICCHECK  := honnef.co/go/tools/cmd/staticcheck@v0.8.2
TOOLS        := $(CURDIR)/bin/tools

.PHONY: help build test deps bench lint demo nomad clean

help: ## list the targets
	@awk -F':.*## ' '/^[a-z-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/nomad-device-zfs (drop it into a Nomad client's plugin_dir)
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/nomad-device-zfs ./cmd/nomad-device-zfs

deps: ## as root: install zfs-fuse when no ZFS is present, and build the pinned Nomad (cached)
	bash scripts/ensure-zfs.sh
	bash scripts/build-nomad.sh >/dev/null

test: deps ## run every test: unit, real pool, real gRPC, real Nomad agent (as root)
	$(GO) test -p 1 -count=1 -timeout 45m ./...

bench: deps ## as root: the plugin against zfs floors on real pools (10/100/900 slots), then the churn of short jobs on a real Nomad agent against the same jobs without a device; prints tables, writes bench/results.json and bench/churn-results.json
	$(GO) run ./bench/cmd/zfsbench -out bench/results.json
	$(GO) run ./bench/cmd/zfsbench -churn -churn-out bench/churn-results.json

lint: ## gofmt, go vet, staticcheck
	@out=$$(gofmt -l cmd internal e2e bench); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOBIN=$(TOOLS) $(GO) install $(STATICCHECK)
	$(TOOLS)/staticcheck ./...

demo: ## as root: sandbox pool + Nomad dev agent + the example job; KEEP=1 keeps it running
	bash scripts/demo.sh

nomad: ## build the pinned Nomad agent and print its path
	@bash scripts/build-nomad.sh

clean: ## remove build output
	rm -rf bin
