#!/usr/bin/env bash
# ensure-node.sh — make sure Node.js is on PATH for the CDK.
#
# The CDK for Go is the TypeScript CDK run by jsii in a Node.js child process,
# so synthesizing or testing the stack from Go needs `node` (no npm packages:
# the CDK's JavaScript ships inside the Go module). Used by `make synth` and
# `make infra-test`.
#
# Finds node on PATH; if it is missing and this runs as root (CI on a fresh
# Debian machine), installs Debian's nodejs with apt-get; otherwise fails with
# what to do. Prints the version it found.

set -euo pipefail

readonly MIN_MAJOR=18 # the oldest Node.js that jsii still runs on

die() {
	printf 'ensure-node: error: %s\n' "$*" >&2
	exit 1
}

if ! command -v node >/dev/null 2>&1; then
	if [[ ${EUID} -ne 0 ]]; then
		die "node is not on PATH: install Node.js ${MIN_MAJOR} or newer (e.g. sudo apt-get install nodejs)"
	fi
	printf 'ensure-node: installing nodejs with apt-get\n' >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq nodejs >&2
	command -v node >/dev/null 2>&1 || die "apt-get installed nodejs but node is still not on PATH"
fi

version=$(node --version) # v20.11.1
major=${version#v}
major=${major%%.*}
if ! [[ ${major} =~ ^[0-9]+$ ]] || ((major < MIN_MAJOR)); then
	die "node ${version} is too old for the CDK: install Node.js ${MIN_MAJOR} or newer"
fi
printf 'ensure-node: node %s (%s)\n' "${version}" "$(command -v node)" >&2
