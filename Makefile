# Idempotency key archive: make help lists the targets.

SHELL := /bin/bash
GO ?= go
# Throwaway PostgreSQL (and Redis) for the duration of one command, unless
# DATABASE_URL / REDIS_URL are already set.
WITH_SERVICES := scripts/with-services.sh
GOTEST_FLAGS ?= -race -count=1 -timeout 15m

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_%-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: test
test: lint ## Run every test against a throwaway PostgreSQL (self-provisioning)
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) $(GO) test $(GOTEST_FLAGS) ./...

.PHONY: lint
lint: ## go vet and gofmt
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on: $$unformatted"; exit 1; fi

.PHONY: archivectl
archivectl: ## Build the operator CLI into bin/archivectl
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/archivectl ./cmd/archivectl

.PHONY: db-shell
db-shell: archivectl ## Throwaway database, migrated and partitioned, with a shell that has DATABASE_URL set
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'bin/archivectl migrate && bin/archivectl partitions && echo "DATABASE_URL=$$DATABASE_URL (exit the shell to stop it)" && PATH="$$PWD/bin:$$PATH" bash -i'
