# shellcheck shell=bash
# Sourced by scripts/demo, scripts/test and scripts/services.sh (or by hand:
# `source scripts/env.sh && cairn_setup`). Safe under `set -euo pipefail`;
# does not change the caller's shell options.
#
# Sets ROOT, STATE, CAIRN_PG_PORT, CAIRN_REDIS_PORT, CAIRN_RABBITMQ_PORT,
# CAIRN_DATABASE_URL, CAIRN_REDIS_URL (all but the first two only when not already
# set by the user) and defines cairn_setup, which makes the venv, installs system
# packages if they are missing and starts Postgres, Redis and RabbitMQ via
# scripts/services.sh up. Redis stays the broker unless CAIRN_BROKER_URL says
# otherwise: the tests use RabbitMQ for the runs they repeat on it.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.cairn"
export ROOT STATE

: "${CAIRN_PG_PORT:=54329}"
: "${CAIRN_REDIS_PORT:=63790}"
: "${CAIRN_RABBITMQ_PORT:=5672}"
: "${CAIRN_DATABASE_URL:=postgresql://postgres@127.0.0.1:$CAIRN_PG_PORT/cairn}"
: "${CAIRN_REDIS_URL:=redis://127.0.0.1:$CAIRN_REDIS_PORT/0}"
export CAIRN_PG_PORT CAIRN_REDIS_PORT CAIRN_RABBITMQ_PORT CAIRN_DATABASE_URL CAIRN_REDIS_URL

cairn_say() { printf 'cairn: %s\n' "$*" >&2; }

# Directory holding initdb/pg_ctl/postgres/psql. CAIRN_PG_BINDIR overrides.
# Note /usr/bin/pg_config comes from libpq-dev, which a clean machine with only
# postgresql-15 installed does not have, so also look in /usr/lib/postgresql.
cairn_pg_bindir() {
    local d
    if [ -n "${CAIRN_PG_BINDIR:-}" ] && [ -x "$CAIRN_PG_BINDIR/initdb" ]; then
        printf '%s\n' "$CAIRN_PG_BINDIR"; return 0
    fi
    if command -v pg_config >/dev/null 2>&1; then
        d="$(pg_config --bindir 2>/dev/null || true)"
        if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            printf '%s\n' "$d"; return 0
        fi
    fi
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
        printf '%s\n' "$d"; return 0
    fi
    return 1
}

_cairn_apt_install() {
    # usage: _cairn_apt_install pkg...   (quiet; log in $STATE/logs/apt.log)
    local log="$STATE/logs/apt.log" sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then sudo=(sudo -n); else
            cairn_say "need to install $* but not root and no sudo; install them by hand"
            return 1
        fi
    fi
    if [ -z "${_CAIRN_APT_UPDATED:-}" ]; then
        if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$log" 2>&1; then
            cairn_say "apt-get update failed; last lines of $log:"; tail -n 20 "$log" >&2
            return 1
        fi
        _CAIRN_APT_UPDATED=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends "$@" >>"$log" 2>&1
}

cairn_setup() {
    mkdir -p "$STATE/logs"
    local py="${CAIRN_PYTHON:-python3}" venv="$ROOT/.venv"
    local stamp="$STATE/pip-install.stamp" piplog="$STATE/logs/pip-install.log"

    # (a) virtualenv + editable install, re-run only when pyproject.toml changed
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        cairn_say "creating virtualenv $venv"
        if ! "$py" -m venv "$venv" >"$STATE/logs/venv.log" 2>&1; then
            # Debian's python3 ships without ensurepip unless python3-venv is installed
            if ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
                local pyver
                pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
                cairn_say "installing python$pyver-venv (apt, log: .cairn/logs/apt.log)"
                _cairn_apt_install "python$pyver-venv" || _cairn_apt_install python3-venv || true
            fi
            if ! "$py" -m venv "$venv" >"$STATE/logs/venv.log" 2>&1; then
                cairn_say "'$py -m venv $venv' failed:"; tail -n 20 "$STATE/logs/venv.log" >&2
                return 1
            fi
        fi
        rm -f "$stamp"
    fi
    if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
        cairn_say "$venv/bin/python cannot run pip (broken venv?); remove $venv and retry"
        return 1
    fi
    if [ ! -e "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ]; then
        cairn_say "installing Python deps… (log: ${piplog#"$ROOT"/})"
        if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/python" -m pip install -q \
                -e "$ROOT[dev,bench,pydantic-ai,langgraph,openai-agents,otel,server,docs]" >"$piplog" 2>&1; then
            cairn_say "pip install failed; last lines of $piplog:"
            tail -n 30 "$piplog" >&2
            return 1
        fi
        touch "$stamp"
    fi

    # (b) system binaries
    local need=()
    cairn_pg_bindir >/dev/null || need+=(pg)
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 \
        || need+=(redis)
    [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || need+=(rabbitmq)
    if [ "${#need[@]}" -gt 0 ]; then
        local want=() p
        for p in "${need[@]}"; do
            case $p in
                pg) want+=(postgresql-15) ;;
                redis) want+=(redis-server) ;;
                rabbitmq) want+=(rabbitmq-server) ;;
            esac
        done
        cairn_say "installing system packages: ${want[*]} (apt, log: .cairn/logs/apt.log)"
        if ! _cairn_apt_install "${want[@]}"; then
            # postgresql-15 is Debian 12's; elsewhere fall back to the meta package
            want=("${want[@]/postgresql-15/postgresql}")
            if ! _cairn_apt_install "${want[@]}"; then
                cairn_say "apt-get install ${want[*]} failed; last lines of .cairn/logs/apt.log:"
                tail -n 20 "$STATE/logs/apt.log" >&2
                return 1
            fi
        fi
        if ! cairn_pg_bindir >/dev/null || ! command -v redis-server >/dev/null 2>&1 \
                || [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
            cairn_say "Postgres/Redis/RabbitMQ binaries still not found after apt-get install"
            return 1
        fi
    fi

    # (c) services
    bash "$ROOT/scripts/services.sh" up
}

# The TypeScript client's compiler and generator (tests/fleet/test_typescript.py), as its
# lock pins them, where node and npm are installed (the test skips, saying so, where not);
# again when the lock changed.
_cairn_npm_ci() {
    local dir="$ROOT/clients/typescript"
    command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 || return 0
    [ "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ] && return 0
    cairn_say "installing the TypeScript client's tools (npm ci, log: .cairn/logs/npm.log)"
    if ! (cd "$dir" && npm ci --no-audit --no-fund) >"$STATE/logs/npm.log" 2>&1; then
        # Only tests/fleet/test_typescript.py needs it: that test fails, saying so, not all.
        cairn_say "npm ci in clients/typescript failed; last lines of .cairn/logs/npm.log:"
        tail -n 20 "$STATE/logs/npm.log" >&2
    fi
}

# What only the tests need: a headless browser for the web pages (Debian's chromium and
# chromedriver), curl for the README's API session, and PgBouncer for the crash tests.
cairn_setup_test_tools() {
    _cairn_npm_ci
    local want=()
    command -v chromium >/dev/null 2>&1 || want+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || want+=(chromium-driver)
    command -v curl >/dev/null 2>&1 || want+=(curl)
    command -v pgbouncer >/dev/null 2>&1 || want+=(pgbouncer)
    [ "${#want[@]}" -eq 0 ] && return 0
    cairn_say "installing test tools: ${want[*]} (apt, log: .cairn/logs/apt.log)"
    if ! _cairn_apt_install "${want[@]}"; then
        cairn_say "apt-get install ${want[*]} failed; last lines of .cairn/logs/apt.log:"
        tail -n 20 "$STATE/logs/apt.log" >&2
        return 1
    fi
}
