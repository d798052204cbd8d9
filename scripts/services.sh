#!/usr/bin/env bash
# Local Postgres + Redis for cairn.   usage: scripts/services.sh up|down|status
#
# Postgres: data in $STATE/pg, unix socket in $STATE/pg-run, log in
#   $STATE/logs/postgres.log, listening on 127.0.0.1:$CAIRN_PG_PORT, trust auth,
#   superuser "postgres", database "cairn". initdb/postgres refuse to run as
#   root, so as root they run as the system user "postgres". If that user can't
#   reach $STATE (e.g. the repo lives under /root, mode 700), the data dir, socket
#   and log go to /tmp/cairn-pg-<uid>-<hash of ROOT>/ instead ($STATE/pg-location
#   says where; $STATE/logs/postgres.log is then a symlink to the real log).
# Redis: daemonized, AOF (appendfsync everysec), data in $STATE/redis, log in
#   $STATE/logs/redis.log, listening on 127.0.0.1:$CAIRN_REDIS_PORT.
set -euo pipefail
# shellcheck source=scripts/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

say() { cairn_say "$@"; }
die() { cairn_say "$@"; exit 1; }

IS_ROOT=0; [ "$(id -u)" -eq 0 ] && IS_ROOT=1
HASH="$(printf '%s' "$ROOT" | sha1sum | cut -c1-8)"
mkdir -p "$STATE/logs" "$STATE/redis"

# ---------------------------------------------------------------- postgres
PG_BIN=""
PG_RUNAS=()

pg_layout() {
    PG_BIN="$(cairn_pg_bindir)" \
        || die "PostgreSQL server binaries not found (apt-get install postgresql-15, or run cairn_setup)"
    PG_BASE="$STATE"
    PGDATA_DIR="$STATE/pg"
    PG_SOCK="$STATE/pg-run"
    PG_LOG="$STATE/logs/postgres.log"
    PG_FALLBACK=0
    if [ "$IS_ROOT" -eq 1 ]; then
        if ! id -u postgres >/dev/null 2>&1; then
            say "creating system user 'postgres'"
            useradd --system --user-group --no-create-home --home-dir /nonexistent \
                --shell /usr/sbin/nologin postgres
        fi
        PG_RUNAS=(runuser -u postgres --)
        if ! pg_as test -x "$STATE"; then
            PG_FALLBACK=1
            PG_BASE="/tmp/cairn-pg-$(id -u)-$HASH"
            PGDATA_DIR="$PG_BASE/data"
            PG_SOCK="$PG_BASE/run"
            PG_LOG="$PG_BASE/postgres.log"
        fi
    fi
    # unix socket paths are limited to ~107 bytes
    if [ $(( ${#PG_SOCK} + 16 )) -gt 100 ]; then
        PG_SOCK="/tmp/cairn-pg-sock-$(id -u)-$HASH"
    fi
}

# run a command as the postgres user when root (from / so cwd is readable)
pg_as() { ( cd / && "${PG_RUNAS[@]}" "$@" ); }

pg_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$CAIRN_PG_PORT" -U postgres -d postgres -t 2 >/dev/null 2>&1; }

pg_psql() { "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$CAIRN_PG_PORT" -U postgres "$@"; }

pg_mkdir_owned() {  # dir mode
    mkdir -p "$1"
    chmod "$2" "$1"
    if [ "$IS_ROOT" -eq 1 ]; then chown postgres:postgres "$1"; fi
}

pg_prepare_dirs() {
    if [ "$PG_FALLBACK" -eq 1 ]; then
        if [ -e "$PG_BASE" ] && [ "$(stat -c %u "$PG_BASE")" != "$(id -u)" ]; then
            die "$PG_BASE exists and is not owned by $(id -un); remove it"
        fi
        mkdir -p "$PG_BASE"; chmod 755 "$PG_BASE"
        printf '%s\n' "$PGDATA_DIR" >"$STATE/pg-location"
        ln -sfn "$PG_LOG" "$STATE/logs/postgres.log"
    fi
    pg_mkdir_owned "$PGDATA_DIR" 700
    pg_mkdir_owned "$PG_SOCK" 755
    touch "$PG_LOG"
    if [ "$IS_ROOT" -eq 1 ]; then chown postgres:postgres "$PG_LOG"; fi
}

pg_up() {
    pg_layout
    if pg_ready; then
        local dd
        dd="$(pg_psql -d postgres -tAc 'show data_directory' 2>/dev/null || true)"
        if [ -n "$dd" ] && [ "$dd" != "$PGDATA_DIR" ]; then
            say "warning: port $CAIRN_PG_PORT is served by another Postgres (data dir $dd)"
        fi
        say "postgres already running on 127.0.0.1:$CAIRN_PG_PORT"
    else
        pg_prepare_dirs
        if [ "$PG_FALLBACK" -eq 1 ]; then
            say "note: user 'postgres' cannot reach $STATE; Postgres data lives in $PGDATA_DIR"
        fi
        if [ ! -s "$PGDATA_DIR/PG_VERSION" ]; then
            say "initdb $PGDATA_DIR"
            if ! pg_as "$PG_BIN/initdb" -D "$PGDATA_DIR" -A trust -U postgres \
                    --encoding=UTF8 --no-locale >"$STATE/logs/initdb.log" 2>&1; then
                tail -n 20 "$STATE/logs/initdb.log" >&2
                die "initdb failed (log: $STATE/logs/initdb.log)"
            fi
        fi
        say "starting postgres on 127.0.0.1:$CAIRN_PG_PORT"
        local opts out
        opts="-c listen_addresses=127.0.0.1 -p $CAIRN_PG_PORT -k '$PG_SOCK'"
        opts+=" -c max_connections=200 -c fsync=on -c synchronous_commit=on"
        if ! out="$(pg_as "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -w -t 60 -l "$PG_LOG" \
                -o "$opts" start 2>&1)"; then
            printf '%s\n' "$out" >&2
            tail -n 20 "$PG_LOG" >&2 || true
            die "postgres failed to start (log: $PG_LOG)"
        fi
        local i
        for i in $(seq 1 50); do pg_ready && break; sleep 0.2; done
        pg_ready || die "postgres started but 127.0.0.1:$CAIRN_PG_PORT is not ready (log: $PG_LOG)"
    fi
    if [ "$(pg_psql -d postgres -tAc "select 1 from pg_database where datname='cairn'")" != 1 ]; then
        say "creating database cairn"
        "$PG_BIN/createdb" -h 127.0.0.1 -p "$CAIRN_PG_PORT" -U postgres cairn
    fi
}

pg_down() {
    pg_layout
    if [ -s "$PGDATA_DIR/postmaster.pid" ] && pg_as "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
        say "stopping postgres"
        pg_as "$PG_BIN/pg_ctl" -D "$PGDATA_DIR" -w -t 60 stop -m fast >/dev/null
    elif pg_ready; then
        say "warning: something answers on 127.0.0.1:$CAIRN_PG_PORT but it is not $PGDATA_DIR; left alone"
    else
        say "postgres not running"
    fi
}

pg_status() {
    pg_layout
    if pg_ready; then
        say "postgres: up   127.0.0.1:$CAIRN_PG_PORT  data=$PGDATA_DIR"
        return 0
    fi
    say "postgres: down (port $CAIRN_PG_PORT, data=$PGDATA_DIR)"
    return 1
}

# ---------------------------------------------------------------- redis
REDIS_DIR="$STATE/redis"
REDIS_PID="$REDIS_DIR/redis.pid"
REDIS_LOG="$STATE/logs/redis.log"

redis_check_bin() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 \
        || die "redis-server/redis-cli not found (apt-get install redis-server, or run cairn_setup)"
}

redis_ping() {
    [ "$(redis-cli -h 127.0.0.1 -p "$CAIRN_REDIS_PORT" ping 2>/dev/null || true)" = PONG ]
}

redis_up() {
    redis_check_bin
    if redis_ping; then
        say "redis already running on 127.0.0.1:$CAIRN_REDIS_PORT"
        return 0
    fi
    say "starting redis on 127.0.0.1:$CAIRN_REDIS_PORT"
    redis-server --port "$CAIRN_REDIS_PORT" --bind 127.0.0.1 --dir "$REDIS_DIR" \
        --appendonly yes --appendfsync everysec --save '' --daemonize yes \
        --pidfile "$REDIS_PID" --logfile "$REDIS_LOG" \
        || die "redis-server failed to start (log: $REDIS_LOG)"
    local i
    for i in $(seq 1 100); do redis_ping && return 0; sleep 0.1; done
    tail -n 20 "$REDIS_LOG" >&2 || true
    die "redis did not answer PING on 127.0.0.1:$CAIRN_REDIS_PORT (log: $REDIS_LOG)"
}

redis_down() {
    redis_check_bin
    if ! redis_ping; then
        say "redis not running"
        return 0
    fi
    say "stopping redis"
    # NOSAVE skips the RDB snapshot only; the AOF is still flushed and fsynced.
    redis-cli -h 127.0.0.1 -p "$CAIRN_REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 50); do redis_ping || return 0; sleep 0.1; done
    if [ -s "$REDIS_PID" ]; then kill "$(cat "$REDIS_PID")" 2>/dev/null || true; fi
    for i in $(seq 1 50); do redis_ping || return 0; sleep 0.1; done
    die "redis on port $CAIRN_REDIS_PORT did not stop"
}

redis_status() {
    if command -v redis-cli >/dev/null 2>&1 && redis_ping; then
        say "redis:    up   127.0.0.1:$CAIRN_REDIS_PORT  data=$REDIS_DIR"
        return 0
    fi
    say "redis:    down (port $CAIRN_REDIS_PORT)"
    return 1
}

# ---------------------------------------------------------------- main
# An optional second word picks one service (the fault tests restart one at a time).
only="${2:-all}"
case "$only" in all|postgres|redis) ;; *) echo "usage: $0 up|down|status [postgres|redis]" >&2; exit 2 ;; esac
want() { [ "$only" = all ] || [ "$only" = "$1" ]; }
case "${1:-}" in
    up)     if want postgres; then pg_up; fi; if want redis; then redis_up; fi ;;
    down)   if want redis; then redis_down; fi; if want postgres; then pg_down; fi ;;
    status) rc=0; if want postgres; then pg_status || rc=3; fi; if want redis; then redis_status || rc=3; fi; exit "$rc" ;;
    *)      echo "usage: $0 up|down|status [postgres|redis]" >&2; exit 2 ;;
esac
