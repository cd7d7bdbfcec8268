# belay — build, test and lint. Each target has a one-line comment; `make help` lists them.
# The heavy lifting lives in scripts/ so it can be run and read on its own.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

VERSION := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# Each directory under functions/ is one Lambda, built by build-<name>.
FUNCTIONS := $(patsubst functions/%/,%,$(wildcard functions/*/))
FUZZTIME ?= 4s
BENCHTIME ?= 1s

# The sandbox image for this machine (make image), and the sources it is
# built from: make demo rebuilds it only when one of them changed.
IMAGE := bin/belay-sandbox.oci.tar
IMAGE_SOURCES := $(shell find sandbox-task internal -name '*.go' ! -name '*_test.go' 2>/dev/null) \
	sandbox-task/image/packages sandbox-task/image/customize.sh scripts/image.sh go.mod go.sum

.PHONY: help build test fuzz lint bench demo serve synth deploy peers-start peers-stop clean image image-fargate

## help: list the targets
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## build: compile every package, then bin/belay, bin/belay-sandbox and each function's bootstrap
# The binaries leave out the symbol table and DWARF (-s -w): stack traces
# keep their function names and lines, and `go version -m` still reads the
# build info. Debug with a plain `go build` instead.
build: $(addprefix build-,$(FUNCTIONS))
	go build ./...
	@# The binaries are built only once their directories exist.
	@if [ -d cmd/belay ]; then \
		echo "go build -ldflags '-s -w' -o bin/belay ./cmd/belay"; \
		go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/belay ./cmd/belay; \
	else echo "build: cmd/belay does not exist yet; skipping bin/belay"; fi
	@if [ -d sandbox-task ]; then \
		echo "CGO_ENABLED=0 go build -ldflags '-s -w' -o bin/belay-sandbox ./sandbox-task"; \
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/belay-sandbox ./sandbox-task; \
	else echo "build: sandbox-task does not exist yet; skipping bin/belay-sandbox"; fi

## build-NAME: build ./functions/NAME as bin/functions/NAME/bootstrap for Lambda (linux/arm64, provided.al2023)
build-%:
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -tags lambda.norpc -trimpath \
		-ldflags "-s -w $(LDFLAGS)" -o bin/functions/$*/bootstrap ./functions/$*

## image: build the sandbox image for this machine as bin/belay-sandbox.oci.tar, reproducibly (scripts/image.sh; root, mmdebstrap, umoci)
image:
	VERSION=$(VERSION) scripts/image.sh $(IMAGE)

## image-fargate: build the sandbox image for Fargate's architecture (hardening.Sandbox.Architecture) as bin/belay-sandbox-ARCH.oci.tar
image-fargate:
	@arch=$$(go run ./sandbox-task/imagespec | sed -n "s/^IMAGE_FARGATE_ARCH='\(.*\)'$$/\1/p"); \
	echo "VERSION=$(VERSION) BELAY_IMAGE_ARCH=$$arch scripts/image.sh bin/belay-sandbox-$$arch.oci.tar"; \
	VERSION=$(VERSION) BELAY_IMAGE_ARCH=$$arch scripts/image.sh bin/belay-sandbox-$$arch.oci.tar

$(IMAGE): $(IMAGE_SOURCES)
	VERSION=$(VERSION) scripts/image.sh $@

## test: build the sandbox image (twice: the digests must match), start DynamoDB Local, run go test ./... and every fuzz target briefly, stop DynamoDB Local
test:
	FUZZTIME=$(FUZZTIME) scripts/test.sh

## fuzz: run every fuzz target for FUZZTIME (default 4s) each, without peers
fuzz:
	FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

## lint: gofmt, go vet, staticcheck, and no go mod tidy diff
lint:
	@# The same files the go command sees: not testdata, nor dot or underscore directories.
	@unformatted=$$(find . \( -name node_modules -o -name testdata -o -name cdk.out -o -name '.?*' -o -name '_*' \) -prune \
		-o -name '*.go' -print0 | xargs -0 -r gofmt -l); \
	if [ -n "$$unformatted" ]; then echo "lint: gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	go tool staticcheck ./...
	@# -diff prints what tidy would change and leaves go.mod and go.sum alone,
	@# so lint never rewrites files that others are editing in this checkout.
	@go mod tidy -diff || { echo "lint: go.mod/go.sum are not tidy; run go mod tidy"; exit 1; }

## bench: build the sandbox image, start DynamoDB Local, run every benchmark for BENCHTIME (default 1s), stop DynamoDB Local
bench:
	BENCHTIME=$(BENCHTIME) scripts/test.sh bench

## demo: run the main job end to end on the embedded default, its sandbox in the image under runc (scripts/demo.sh)
demo: build $(IMAGE)
	@if [ ! -f scripts/demo.sh ]; then \
		echo "demo: scripts/demo.sh does not exist yet; the demo has not been written" >&2; exit 1; fi
	bash scripts/demo.sh

## serve: run the embedded control plane, bin/belay serve (configured by BELAY_* variables; see README)
serve: build
	@if [ ! -x bin/belay ]; then echo "serve: bin/belay was not built (no cmd/belay yet)" >&2; exit 1; fi
	bin/belay serve

## synth: build the functions, then synthesize the AWS stack (CDK, cdk-nag checked) into cdk.out/
synth: build
	scripts/cdk.sh synth --quiet $(CDK_ARGS)
	@echo "synth: cdk.out/Belay.template.json"

## deploy: build, build and push the sandbox image, and deploy the stack to the account of the AWS credentials (scripts/deploy.sh)
deploy: build
	CDK_ARGS="$(CDK_ARGS)" scripts/deploy.sh

## peers-start: start DynamoDB Local for tests run by hand (then eval the output of scripts/peers.sh env)
peers-start:
	scripts/peers.sh start

## peers-stop: stop the DynamoDB Local that peers-start started
peers-stop:
	scripts/peers.sh stop

## clean: stop the peers-start DynamoDB Local and remove bin/ and cdk.out/
clean: peers-stop
	rm -rf bin cdk.out
