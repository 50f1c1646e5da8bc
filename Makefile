# Idempotency key archive: make help lists the targets.

SHELL := /bin/bash
GO ?= go
# Throwaway PostgreSQL (and Redis) for the duration of one command, unless
# DATABASE_URL / REDIS_URL are already set.
WITH_SERVICES := shared/testenv/with-services.sh
GOTEST_FLAGS ?= -race -count=1 -timeout 15m

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_%-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: test
test: lint ## Run every test against a throwaway PostgreSQL (self-provisioning)
	$(WITH_SERVICES) $(GO) test $(GOTEST_FLAGS) ./...

.PHONY: lint
lint: ## go vet and gofmt
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on: $$unformatted"; exit 1; fi

FUNCTIONS := sweep partitions lookup
BUILD_FLAGS := -tags lambda.norpc -trimpath -ldflags "-s -w"
RIE := bin/tools/aws-lambda-rie
RIE_MODULE := github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d

.PHONY: build
build: $(FUNCTIONS:%=build-%) ## Build bin/<fn>/bootstrap for linux/arm64 and bin/<fn>.zip (what CDK deploys)

.PHONY: build-%
build-%: bin/lambdalocal
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(BUILD_FLAGS) -o bin/$*/bootstrap ./functions/$*
	bin/lambdalocal zip -o bin/$*.zip bin/$*/bootstrap

.PHONY: build-local
build-local: $(FUNCTIONS:%=build-local-%) ## Build bin/local/<fn>/bootstrap for this machine

.PHONY: build-local-%
build-local-%:
	CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/local/$*/bootstrap ./functions/$*

.PHONY: bin/lambdalocal
bin/lambdalocal:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/lambdalocal ./cmd/lambdalocal

$(RIE):
	GOBIN=$(CURDIR)/bin/tools CGO_ENABLED=0 $(GO) install $(RIE_MODULE)

FN ?= lookup
EVENT ?= events/lookup-direct.json

.PHONY: invoke
invoke: build-local-$(FN) bin/lambdalocal archivectl $(RIE) ## Run a real bootstrap under the Lambda emulator: make invoke FN=lookup EVENT=events/lookup-http-api-v2.json
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'bin/archivectl migrate >/dev/null && bin/archivectl partitions >/dev/null && \
		bin/lambdalocal invoke -rie $(RIE) -bootstrap bin/local/$(FN)/bootstrap -event $(EVENT) -seed-probe'

.PHONY: sam-template
sam-template: build bin/lambdalocal ## Write bin/sam/template.json for sam local invoke (needs docker)
	bin/lambdalocal template -o bin/sam/template.json -code-dir ..

.PHONY: archivectl
archivectl: ## Build the operator CLI into bin/archivectl
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/archivectl ./cmd/archivectl

.PHONY: db-shell
db-shell: archivectl ## Throwaway database, migrated and partitioned, with a shell that has DATABASE_URL set
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'bin/archivectl migrate && bin/archivectl partitions && echo "DATABASE_URL=$$DATABASE_URL (exit the shell to stop it)" && PATH="$$PWD/bin:$$PATH" bash -i'
