#!/usr/bin/env bash
# with-services.sh — run a command with throwaway PostgreSQL and Redis.
#
# Usage: shared/testenv/with-services.sh <command> [args...]
#
# Used by `make test` and `make dev`. Starts a private PostgreSQL cluster (on
# a Unix socket in a directory only its owner may enter) and a private
# redis-server (on a free port bound to 127.0.0.1), data in a fresh temp dir,
# exports DATABASE_URL / REDIS_URL (and PG_BIN_DIR when the PostgreSQL
# binaries were found), runs the command, then stops both services and
# removes the temp dir on any exit — success, failure, Ctrl-C or SIGTERM
# (passed on to the command) — and exits with the command's exit status.
#
# Environment:
#   DATABASE_URL              if set, used as is; no Postgres is started.
#                             WITH_SERVICES_OWN_DATABASE=1 is exported to
#                             the command only when the script started one
#                             (its URL holds no password and may be shown).
#   REDIS_URL                 if set, used as is; no Redis is started.
#   WITH_SERVICES_NO_REDIS=1  do not start Redis (REDIS_URL stays unset).
#   PG_BIN_DIR                the PostgreSQL server binaries to run (default:
#                             the machine's, see find_pg_bin), e.g. those
#                             fetch-postgres.sh installs.
#
# Works as root (CI, fresh Debian 12: missing packages are installed with
# apt-get) and as an ordinary user (packages must already be installed).

set -euo pipefail

readonly PG_USER=idemarchive-test

log() { printf 'with-services: %s\n' "$*" >&2; }
die() {
	printf 'with-services: error: %s\n' "$*" >&2
	exit 1
}

if [[ $# -eq 0 ]]; then
	echo "usage: $0 <command> [args...]" >&2
	exit 2
fi

is_root=false
[[ ${EUID} -eq 0 ]] && is_root=true

# Set only where this script starts the database, never taken from outside.
unset WITH_SERVICES_OWN_DATABASE

# url_encode S: S percent-encoded for a URL's query value, every byte but
# the unreserved ones and '/' (a TMPDIR with a space, '%', '&' or '#').
url_encode() {
	local LC_ALL=C s=$1 out="" c i
	for ((i = 0; i < ${#s}; i++)); do
		c=${s:i:1}
		case ${c} in
		[A-Za-z0-9/._~-]) out+=${c} ;;
		*) out+=$(printf '%%%02X' "'${c}") ;;
		esac
	done
	printf '%s' "${out}"
}

tmp_dir=""
pg_dir=""
pg_data=""
redis_pid=""

# Runs on every exit path. It must never abort half-way (hence set +e) and
# must keep the exit status the script was leaving with.
# shellcheck disable=SC2317 # only called via trap, which shellcheck can't see
cleanup() {
	local rc=$?
	set +e
	if [[ -n ${redis_pid} ]] && kill -0 "${redis_pid}" 2>/dev/null; then
		kill "${redis_pid}" 2>/dev/null
		# Give it a moment to exit cleanly, then make sure it is gone.
		local i
		for ((i = 0; i < 50; i++)); do
			kill -0 "${redis_pid}" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "${redis_pid}" 2>/dev/null
		wait "${redis_pid}" 2>/dev/null
	fi
	if [[ -n ${pg_data} && -f ${pg_data}/postmaster.pid ]]; then
		local pm_pid
		pm_pid=$(head -n 1 "${pg_data}/postmaster.pid" 2>/dev/null)
		# Immediate mode: the data is thrown away anyway, no checkpoint needed.
		run_pg "${PG_BIN_DIR:-}/pg_ctl" -D "${pg_data}" -m immediate -w -t 30 stop >/dev/null 2>&1
		# Belt and braces in case pg_ctl could not be run (e.g. user switch broke).
		if [[ ${pm_pid} =~ ^[0-9]+$ ]] && kill -0 "${pm_pid}" 2>/dev/null; then
			kill -KILL "${pm_pid}" 2>/dev/null
		fi
	fi
	if [[ -n ${tmp_dir} && -d ${tmp_dir} ]]; then
		rm -rf -- "${tmp_dir}"
	fi
	exit "${rc}"
}
trap cleanup EXIT
# The command, once it runs (in the background, waited for: bash runs a trap
# only once a foreground command ends, so SIGTERM to `make dev` would wait for
# the API to end by itself).
child=""
# forward SIG: pass a signal on to the command, if it runs.
# shellcheck disable=SC2317 # only called via trap
# The command may have ended already (a signal to the whole process group
# reached it first): that is no failure of the script's.
forward() {
	if [[ -n ${child} ]]; then
		kill -"$1" "${child}" 2>/dev/null || true
	fi
}
# Turn signals into a normal exit so the EXIT trap runs (128 + signal number).
# SIGTERM and SIGHUP stop everything at once, the command too; SIGINT (which
# Ctrl-C also sends the command itself) is the command's to act on: an
# interactive shell under `make db-shell` ignores it and keeps its database.
trap 'forward HUP; exit 129' HUP
trap 'forward INT; [[ -n ${child} ]] || exit 130' INT
trap 'forward TERM; exit 143' TERM

apt_updated=false
# apt_install PKG: install a Debian package, only possible as root with apt-get.
apt_install() {
	log "installing Debian package $1 (apt-get)"
	if ! ${apt_updated}; then
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
		apt_updated=true
	fi
	# Output to stderr: stdout belongs to the wrapped command.
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >&2
}

can_apt_install() { ${is_root} && command -v apt-get >/dev/null 2>&1; }

# port_in_use PORT: true if something listens on 127.0.0.1:PORT.
port_in_use() {
	local port=$1
	# A successful connect means someone is listening.
	if (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then
		return 0
	fi
	# ss also sees listeners on other addresses (e.g. 0.0.0.0 or ::) that
	# would make our bind fail.
	if command -v ss >/dev/null 2>&1 &&
		[[ -n $(ss -Hltn "sport = :${port}" 2>/dev/null) ]]; then
		return 0
	fi
	return 1
}

# free_port: print a free port, from 20000 up to the kernel's ephemeral
# range (ip_local_port_range; 32768 by default): a port in that range may
# be the local end of any outgoing connection by the time the server binds
# it, which no listener check sees. A random start keeps parallel runs
# (several worktrees, CI) from racing for the same port; a server that
# still loses its port is started again on another (see
# lost_port).
free_port() {
	local low=20000 high=40000 ephemeral i port
	ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true)
	if [[ ${ephemeral} =~ ^[0-9]+$ ]] && ((ephemeral > low + 1000)); then
		high=${ephemeral}
	fi
	local span=$((high - low)) start=$((RANDOM % (high - low)))
	for ((i = 0; i < 500; i++)); do
		port=$((low + (start + i) % span))
		if ! port_in_use "${port}"; then
			echo "${port}"
			return 0
		fi
	done
	die "no free TCP port found in ${low}-$((high - 1))"
}

# lost_port LOG: true if the server logging to LOG could not bind its port
# because something took it after free_port chose it.
lost_port() { grep -q "Address already in use" "$1" 2>/dev/null; }

# tail_log NAME FILE: show the end of a service log after a startup failure.
tail_log() {
	if [[ -s $2 ]]; then
		printf 'with-services: last lines of %s log (%s):\n' "$1" "$2" >&2
		tail -n 30 -- "$2" >&2
	fi
}

# ---------------------------------------------------------------- PostgreSQL

# find_pg_bin: print the first directory holding initdb, pg_ctl and postgres:
# the one initdb on PATH resolves to (symlinks followed, so that e.g.
# /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin gives the real dir with
# psql too), else the newest /usr/lib/postgresql/<version>/bin (Debian's
# layout, which is not on PATH).
find_pg_bin() {
	local candidates=() dir found
	if found=$(command -v initdb 2>/dev/null); then
		candidates+=("$(dirname -- "$(readlink -f -- "${found}")")")
	fi
	# sort -V so that 9.6 < 10 < 15 < 16.
	while IFS= read -r dir; do
		[[ -n ${dir} ]] && candidates+=("${dir}")
	done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -rV || true)
	for dir in "${candidates[@]+"${candidates[@]}"}"; do
		if [[ -x ${dir}/initdb && -x ${dir}/pg_ctl && -x ${dir}/postgres ]]; then
			echo "${dir}"
			return 0
		fi
	done
	return 1
}

# run_pg CMD...: run a PostgreSQL command as the cluster owner. initdb and
# postgres refuse to run as root, so as root they run as ${PG_USER}.
run_pg() {
	if ! ${is_root}; then
		"$@"
		return
	fi
	# cd first: the user may not be allowed into the caller's cwd (e.g. /root),
	# which makes initdb/postgres complain.
	if command -v runuser >/dev/null 2>&1; then
		(cd "${pg_dir}" && runuser -u "${PG_USER}" -- "$@")
	else
		# Arguments go through "$@" of sh -c, so nothing is re-quoted; the
		# "--" stops su from parsing the command's options (e.g. -w) as its own.
		(cd "${pg_dir}" && su -s /bin/sh -c 'exec "$@"' -- "${PG_USER}" sh "$@")
	fi
}

ensure_pg_user() {
	id -u "${PG_USER}" >/dev/null 2>&1 && return 0
	command -v useradd >/dev/null 2>&1 ||
		die "running as root but useradd is missing; cannot create user ${PG_USER} to run PostgreSQL"
	# A system user without home or login shell: it only owns the cluster.
	# Another run may create it concurrently, so re-check on failure.
	useradd --system --no-create-home --home-dir /nonexistent \
		--shell /usr/sbin/nologin "${PG_USER}" 2>/dev/null ||
		id -u "${PG_USER}" >/dev/null 2>&1 ||
		die "could not create system user ${PG_USER}"
}

# pg_initdb LOCALE: create the cluster in ${pg_data} (wiped first, so it can
# be retried with another locale).
pg_initdb() {
	rm -rf -- "${pg_data}"
	mkdir -m 700 -- "${pg_data}"
	${is_root} && chown "${PG_USER}:" "${pg_data}"
	run_pg "${PG_BIN_DIR}/initdb" -D "${pg_data}" -U postgres --auth=trust \
		-E UTF8 --locale="$1" >>"${pg_dir}/initdb.log" 2>&1
}

start_postgres() {
	if [[ -z ${PG_BIN_DIR:-} ]]; then
		if can_apt_install; then
			apt_install postgresql
			PG_BIN_DIR=$(find_pg_bin) ||
				die "PostgreSQL binaries still not found after installing the postgresql package"
		else
			die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH or in /usr/lib/postgresql/*/bin; install PostgreSQL (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL"
		fi
		export PG_BIN_DIR
	fi

	pg_dir=${tmp_dir}/pg
	pg_data=${pg_dir}/data
	mkdir -m 755 -- "${pg_dir}"
	if ${is_root}; then
		ensure_pg_user
		# The cluster owner writes data, log and socket here.
		chown "${PG_USER}:" "${pg_dir}"
		run_pg test -w "${pg_dir}" ||
			die "user ${PG_USER} cannot write to ${pg_dir}; is TMPDIR (${TMPDIR:-/tmp}) traversable by other users?"
		# Binaries the cluster owner cannot reach (fetch-postgres.sh's, in a
		# checkout under /root): it runs a copy of their install, whose bin,
		# lib and share stay side by side.
		if ! run_pg test -x "${PG_BIN_DIR}/postgres"; then
			local install
			install=$(dirname -- "${PG_BIN_DIR}")
			cp -a -- "${install}" "${pg_dir}/install"
			chmod -R a+rX -- "${pg_dir}/install"
			PG_BIN_DIR=${pg_dir}/install/bin
			run_pg test -x "${PG_BIN_DIR}/postgres" ||
				die "user ${PG_USER} cannot run ${PG_BIN_DIR}/postgres"
		fi
	fi

	# C.UTF-8 gives UTF-8 collation without a generated locale; older systems
	# may lack it, and plain C works everywhere.
	if ! pg_initdb C.UTF-8; then
		log "initdb with locale C.UTF-8 failed; retrying with locale C"
		if ! pg_initdb C; then
			tail_log initdb "${pg_dir}/initdb.log"
			die "initdb failed"
		fi
	fi

	# The cluster trusts every connection it takes (tests sign in as the roles
	# they create, without passwords), so it takes them only on a socket in a
	# directory no other user may enter: over TCP, even on loopback, every
	# account on the machine could sign in as its superuser and run programs
	# as the cluster's owner (COPY ... TO PROGRAM).
	pg_sock=${pg_dir}/sock
	# postgresql.conf quotes the value, and reads it as a list split at
	# commas: say so rather than start a cluster listening elsewhere.
	case ${pg_sock} in
	*[\'\",\\]*) die "the temporary directory ${pg_sock} holds a quote, a comma or a backslash, which PostgreSQL's unix_socket_directories cannot take: set TMPDIR to a directory without them" ;;
	esac
	mkdir -m 700 -- "${pg_sock}"
	${is_root} && chown "${PG_USER}:" "${pg_sock}"

	# Appended settings override initdb's defaults. Durability is off because
	# the cluster is thrown away.
	cat >>"${pg_data}/postgresql.conf" <<-EOF

		# --- with-services.sh: throwaway test cluster ---
		listen_addresses = ''
		unix_socket_directories = '${pg_sock}'
		fsync = off
		synchronous_commit = off
		full_page_writes = off
		max_connections = 200
		shared_buffers = 128MB
	EOF

	local port attempt pg_log
	for ((attempt = 1; ; attempt++)); do
		port=$(free_port)
		# The last port line wins.
		echo "port = ${port}" >>"${pg_data}/postgresql.conf"
		# A log per attempt (the server's user writes it): the last
		# attempt's says why it failed.
		pg_log=${pg_dir}/postgres.${attempt}.log
		if run_pg "${PG_BIN_DIR}/pg_ctl" -D "${pg_data}" -l "${pg_log}" \
			-w -t 60 start >/dev/null 2>>"${pg_dir}/pg_ctl.log"; then
			break
		fi
		if ((attempt < 5)) && lost_port "${pg_log}"; then
			log "port ${port} was taken before PostgreSQL bound it; trying another"
			continue
		fi
		tail_log pg_ctl "${pg_dir}/pg_ctl.log"
		tail_log postgres "${pg_log}"
		die "PostgreSQL failed to start (socket ${pg_sock}, port ${port})"
	done

	export DATABASE_URL="postgres://postgres@/postgres?host=$(url_encode "${pg_sock}")&port=${port}&sslmode=disable"
	export WITH_SERVICES_OWN_DATABASE=1
	local version
	version=$("${PG_BIN_DIR}/postgres" --version 2>/dev/null | sed -n 's/.*(PostgreSQL) \([0-9][0-9.]*\).*/\1/p')
	log "postgres ${version%%.*} on socket ${pg_sock}/.s.PGSQL.${port}"
}

# ---------------------------------------------------------------------- Redis

# redis_ping PORT: true once the server answers PONG.
redis_ping() {
	local port=$1 reply=""
	if command -v redis-cli >/dev/null 2>&1; then
		# Bounded: a listener that is not ours (the port taken meanwhile)
		# may accept and never answer.
		[[ $(timeout 2 redis-cli -h 127.0.0.1 -p "${port}" ping 2>/dev/null) == PONG ]]
		return
	fi
	# No redis-cli: speak the protocol over bash's /dev/tcp, in a subshell so
	# the fd never leaks into this shell.
	reply=$(
		exec 3<>"/dev/tcp/127.0.0.1/${port}" &&
			printf 'PING\r\n' >&3 &&
			IFS= read -r -t 2 line <&3 &&
			printf '%s' "${line%$'\r'}"
	) 2>/dev/null || true
	[[ ${reply} == +PONG ]]
}

start_redis() {
	if ! command -v redis-server >/dev/null 2>&1; then
		if can_apt_install; then
			# If the package starts its own system service, that one is left
			# alone: ours is a separate process on its own port.
			apt_install redis-server
			command -v redis-server >/dev/null 2>&1 ||
				die "redis-server still not found after installing the redis-server package"
		else
			die "redis-server not found on PATH; install Redis (Debian/Ubuntu: apt-get install redis-server), set REDIS_URL, or set WITH_SERVICES_NO_REDIS=1"
		fi
	fi

	local port log_file=${tmp_dir}/redis.log attempt=1
	start_redis_on_free_port() {
		port=$(free_port)
		# Foreground server in the background of this script, so we own its
		# pid. No persistence: the data is throwaway. Logs go to stdout ->
		# log file.
		redis-server --port "${port}" --bind 127.0.0.1 --save '' --appendonly no \
			--daemonize no --dir "${tmp_dir}" \
			</dev/null >"${log_file}" 2>&1 &
		redis_pid=$!
	}
	start_redis_on_free_port

	local i
	for ((i = 0; i < 100; i++)); do
		if ! kill -0 "${redis_pid}" 2>/dev/null; then
			redis_pid=""
			if ((attempt < 5)) && lost_port "${log_file}"; then
				log "port ${port} was taken before redis-server bound it; trying another"
				attempt=$((attempt + 1)) i=0
				start_redis_on_free_port
				continue
			fi
			tail_log redis "${log_file}"
			die "redis-server exited during startup (port ${port})"
		fi
		if redis_ping "${port}"; then
			export REDIS_URL="redis://127.0.0.1:${port}/0"
			local version
			version=$(redis-server --version 2>/dev/null | sed -n 's/.*v=\([0-9.]*\).*/\1/p')
			log "redis ${version} on 127.0.0.1:${port}"
			return 0
		fi
		sleep 0.1
	done
	tail_log redis "${log_file}"
	die "redis-server did not answer PING on 127.0.0.1:${port} within 10s"
}

# ----------------------------------------------------------------------- main

# Look for the PostgreSQL binaries even when DATABASE_URL is given, so tests
# can still use psql from PG_BIN_DIR; installing is only done when needed.
if [[ -n ${PG_BIN_DIR:-} ]]; then
	# A directory set is the one run (make test-pg17 sets 17's): never
	# silently replaced by the machine's, which would test another version.
	for tool in pg_ctl initdb postgres; do
		[[ -x ${PG_BIN_DIR}/${tool} ]] ||
			die "PG_BIN_DIR=${PG_BIN_DIR} has no ${tool}: fix it, or unset it for the machine's PostgreSQL"
	done
else
	PG_BIN_DIR=$(find_pg_bin) || PG_BIN_DIR=""
fi
if [[ -n ${PG_BIN_DIR} ]]; then
	export PG_BIN_DIR
else
	unset PG_BIN_DIR
fi

need_pg=false
need_redis=false
[[ -z ${DATABASE_URL:-} ]] && need_pg=true
[[ -z ${REDIS_URL:-} && ${WITH_SERVICES_NO_REDIS:-} != 1 ]] && need_redis=true

if ${need_pg} || ${need_redis}; then
	tmp_dir=$(mktemp -d -t with-services.XXXXXXXX)
	# mktemp makes it 0700; the unprivileged cluster owner must get through it.
	chmod 755 -- "${tmp_dir}"
fi

${need_pg} && start_postgres
${need_redis} && start_redis

# Not exec: the EXIT trap has to run after the command to stop the services.
# Its stdin stays the script's (a background command's would be /dev/null).
# A non-interactive shell starts a background command with SIGINT and
# SIGQUIT ignored, which everything it runs inherits (an interactive shell's
# commands too): GNU env gives them back their default action, so that
# Ctrl-C stops the command. Elsewhere only a command that handles SIGINT
# itself (the Go tools here do) stops on it.
if env --default-signal=INT,QUIT true 2>/dev/null; then
	env --default-signal=INT,QUIT -- "$@" <&0 &
else
	"$@" <&0 &
fi
child=$!
# A trapped signal ends a wait early; wait again until the command has ended.
while kill -0 "${child}" 2>/dev/null; do
	wait "${child}" 2>/dev/null || true
done
status=0
wait "${child}" 2>/dev/null || status=$?
if ((status < 0 || status > 255)); then
	# bash 5.2 can lose the status of a command that ended while a trap
	# ran (its wait then returns -1): Ctrl-C's, as a command it stopped
	# would have.
	status=130
fi
exit "${status}"
