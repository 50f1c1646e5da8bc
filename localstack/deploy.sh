#!/usr/bin/env bash
# deploy.sh — deploy the idempotency archive's stack to a running LocalStack.
#
# Usage: localstack/deploy.sh          (after docker compose -f localstack/compose.yaml up -d --wait)
#
# Builds the function zips (make build), synthesizes the stack with the props
# of localstack/context.json into cdk.out/localstack (the same props the
# infra tests synthesize and run cdk-nag on), then bootstraps and deploys that
# cloud assembly with cdklocal, the CDK CLI wrapper that points the CLI at
# LocalStack. Needs go, node/npx and make; npx fetches aws-cdk and
# aws-cdk-local from the npm registry on first use.
#
# Environment:
#   AWS_ENDPOINT_URL    LocalStack's endpoint (default http://localhost:4566)
#   AWS_DEFAULT_REGION  region to deploy to (default us-east-1)

set -euo pipefail

die() {
	printf 'deploy: error: %s\n' "$*" >&2
	exit 1
}

cd "$(dirname "$0")/.."
export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://localhost:4566}
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export AWS_REGION=${AWS_DEFAULT_REGION}
# LocalStack accepts any credentials; these are its documented defaults.
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-test}
export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-test}
readonly ACCOUNT=000000000000 # LocalStack's default account
readonly ASSEMBLY=cdk.out/localstack

command -v npx >/dev/null 2>&1 || die "npx is not on PATH: install Node.js (infra/ensure-node.sh does, as root)"

ready=false
for _ in $(seq 60); do
	if curl -fsS "${AWS_ENDPOINT_URL}/_localstack/health" >/dev/null 2>&1; then
		ready=true
		break
	fi
	sleep 2
done
${ready} || die "LocalStack does not answer at ${AWS_ENDPOINT_URL}: start it with docker compose -f localstack/compose.yaml up -d --wait"

make build
infra/ensure-node.sh
rm -rf "${ASSEMBLY}"
# CDK_OUTDIR and CDK_CONTEXT_JSON are how the CDK CLI itself hands the app
# its output directory and context.
(cd infra && CDK_OUTDIR="../${ASSEMBLY}" CDK_CONTEXT_JSON="$(cat ../localstack/context.json)" go run .)

cdklocal() {
	npx --yes --package aws-cdk@2 --package aws-cdk-local@3 cdklocal "$@"
}
cdklocal bootstrap --app "${ASSEMBLY}" "aws://${ACCOUNT}/${AWS_DEFAULT_REGION}"
cdklocal deploy --app "${ASSEMBLY}" --all --require-approval never --outputs-file "${ASSEMBLY}/outputs.json"
printf 'deploy: done; outputs in %s/outputs.json\n' "${ASSEMBLY}" >&2
