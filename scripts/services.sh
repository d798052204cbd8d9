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
# RabbitMQ: node cairn-$CAIRN_RABBITMQ_PORT@localhost, data and config in
#   $STATE/rabbitmq, logs in $STATE/logs/rabbitmq, listening on
#   127.0.0.1:$CAIRN_RABBITMQ_PORT, no plugins, user guest (loopback only), vhosts
#   cairn-1..cairn-45 (one per test, like Redis databases). Its own epmd on
#   $CAIRN_RABBITMQ_PORT+40000, so two checkouts never share one. As root it runs as the
#   system user "rabbitmq" (from the rabbitmq-server package).
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
        --appendonly yes --appendfsync everysec --save '' --daemonize yes --databases 48 \
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

# ---------------------------------------------------------------- rabbitmq
RMQ_DIR="$STATE/rabbitmq"
RMQ_LOG_DIR="$STATE/logs/rabbitmq"
RMQ_BIN=/usr/lib/rabbitmq/bin
RMQ_RUNAS=()
[ "$IS_ROOT" -eq 1 ] && RMQ_RUNAS=(runuser -u rabbitmq --)

# The environment every rabbitmq command of this node runs with.
rmq_env=(env HOME="$RMQ_DIR" RABBITMQ_CONF_ENV_FILE=/dev/null
    RABBITMQ_NODENAME="cairn-$CAIRN_RABBITMQ_PORT@localhost"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$CAIRN_RABBITMQ_PORT"
    ERL_EPMD_PORT="$((CAIRN_RABBITMQ_PORT + 40000))"
    RABBITMQ_MNESIA_BASE="$RMQ_DIR/mnesia" RABBITMQ_LOG_BASE="$RMQ_LOG_DIR"
    RABBITMQ_CONFIG_FILE="$RMQ_DIR/rabbitmq.conf"
    RABBITMQ_ADVANCED_CONFIG_FILE="$RMQ_DIR/advanced.config"
    RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_DIR/enabled_plugins"
    RABBITMQ_PID_FILE="$RMQ_DIR/rabbitmq.pid")

rmq_as() { ( cd / && "${RMQ_RUNAS[@]}" "${rmq_env[@]}" "$@" ); }

rmq_check_bin() {
    [ -x "$RMQ_BIN/rabbitmq-server" ] \
        || die "rabbitmq-server not found (apt-get install rabbitmq-server, or run cairn_setup)"
}

rmq_ready() { (exec 3<>"/dev/tcp/127.0.0.1/$CAIRN_RABBITMQ_PORT") 2>/dev/null; }

rmq_up() {
    rmq_check_bin
    if rmq_ready; then
        say "rabbitmq already running on 127.0.0.1:$CAIRN_RABBITMQ_PORT"
        return 0
    fi
    mkdir -p "$RMQ_DIR" "$RMQ_LOG_DIR"
    # consumer_timeout: how long a worker may hold a message (a whole run); servers
    # before 3.12 ignore the per-consumer x-consumer-timeout cairn sends.
    cat >"$RMQ_DIR/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$CAIRN_RABBITMQ_PORT
log.console = false
log.file.level = warning
consumer_timeout = 3600000
CONF
    echo '[].' >"$RMQ_DIR/enabled_plugins"
    local vhosts="" perms="" i
    for i in $(seq 1 45); do  # 15 for each pytest process scripts/test runs side by side
        vhosts+="${vhosts:+,}{\"name\":\"cairn-$i\"}"
        perms+="${perms:+,}{\"user\":\"guest\",\"vhost\":\"cairn-$i\",\"configure\":\".*\",\"write\":\".*\",\"read\":\".*\"}"
    done
    printf '{"vhosts":[%s],"permissions":[%s]}\n' "$vhosts" "$perms" >"$RMQ_DIR/vhosts.json"
    if [ "$IS_ROOT" -eq 1 ]; then
        if ! ( cd / && runuser -u rabbitmq -- test -x "$STATE" ); then
            die "user 'rabbitmq' cannot reach $STATE; move the checkout somewhere it can read"
        fi
        chown -R rabbitmq:rabbitmq "$RMQ_DIR" "$RMQ_LOG_DIR"
    fi
    say "starting rabbitmq on 127.0.0.1:$CAIRN_RABBITMQ_PORT"
    rmq_as setsid "$RMQ_BIN/rabbitmq-server" >"$RMQ_LOG_DIR/stdout.log" 2>&1 </dev/null &
    local i
    for i in $(seq 1 600); do rmq_ready && break; sleep 0.1; done
    if ! rmq_ready; then
        tail -n 20 "$RMQ_LOG_DIR/stdout.log" >&2 || true
        die "rabbitmq did not listen on 127.0.0.1:$CAIRN_RABBITMQ_PORT (logs: $RMQ_LOG_DIR)"
    fi
    # Once per start, idempotent: the definitions only add what is missing.
    if ! rmq_as "$RMQ_BIN/rabbitmqctl" -q import_definitions "$RMQ_DIR/vhosts.json" \
            >>"$RMQ_LOG_DIR/stdout.log" 2>&1; then
        tail -n 20 "$RMQ_LOG_DIR/stdout.log" >&2 || true
        die "rabbitmqctl import_definitions failed (logs: $RMQ_LOG_DIR)"
    fi
}

rmq_down() {
    local pid=""
    [ -s "$RMQ_DIR/rabbitmq.pid" ] && pid="$(cat "$RMQ_DIR/rabbitmq.pid")"
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        say "stopping rabbitmq"
        kill -TERM "$pid"  # the Erlang VM shuts down cleanly on SIGTERM
        local i
        for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    elif rmq_ready; then
        say "warning: something answers on 127.0.0.1:$CAIRN_RABBITMQ_PORT but it is not $RMQ_DIR; left alone"
        return 0
    else
        say "rabbitmq not running"
    fi
    # This node's own epmd: it exits when asked and no node is registered with it.
    if command -v epmd >/dev/null 2>&1; then
        ERL_EPMD_PORT="$((CAIRN_RABBITMQ_PORT + 40000))" epmd -kill >/dev/null 2>&1 || true
    fi
}

rmq_status() {
    if rmq_ready; then
        say "rabbitmq: up   127.0.0.1:$CAIRN_RABBITMQ_PORT  data=$RMQ_DIR"
        return 0
    fi
    say "rabbitmq: down (port $CAIRN_RABBITMQ_PORT)"
    return 1
}

# ---------------------------------------------------------------- pgbouncer
# Transaction mode in front of the Postgres above, for any database name, trust auth:
# scripts/test runs the crash tests through it. Refuses root, so runs as postgres.
PGB_DIR="/tmp/cairn-pgbouncer-$(id -u)-$HASH"
: "${CAIRN_PGBOUNCER_PORT:=$((CAIRN_PG_PORT + 10000))}"
pgb_ready() { (exec 3<>"/dev/tcp/127.0.0.1/$CAIRN_PGBOUNCER_PORT") 2>/dev/null; }

pgb_up() {
    command -v pgbouncer >/dev/null 2>&1 || die "pgbouncer not found (apt-get install pgbouncer)"
    if pgb_ready; then say "pgbouncer already running on 127.0.0.1:$CAIRN_PGBOUNCER_PORT"; return 0; fi
    mkdir -p "$PGB_DIR"
    cat >"$PGB_DIR/pgbouncer.ini" <<CONF
[databases]
* = host=127.0.0.1 port=$CAIRN_PG_PORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $CAIRN_PGBOUNCER_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/users.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 20
ignore_startup_parameters = extra_float_digits,options
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
CONF
    echo '"postgres" ""' >"$PGB_DIR/users.txt"
    local run=()
    if [ "$IS_ROOT" -eq 1 ]; then chown -R postgres:postgres "$PGB_DIR"; run=(runuser -u postgres --); fi
    say "starting pgbouncer on 127.0.0.1:$CAIRN_PGBOUNCER_PORT (transaction mode)"
    ( cd / && "${run[@]}" pgbouncer -d "$PGB_DIR/pgbouncer.ini" )
    local i
    for i in $(seq 1 50); do pgb_ready && return 0; sleep 0.1; done
    die "pgbouncer did not listen on 127.0.0.1:$CAIRN_PGBOUNCER_PORT (log: $PGB_DIR/pgbouncer.log)"
}

pgb_down() {
    if [ -s "$PGB_DIR/pgbouncer.pid" ] && kill -0 "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null; then
        say "stopping pgbouncer"; kill -TERM "$(cat "$PGB_DIR/pgbouncer.pid")"
    fi
}

# ---------------------------------------------------------------- main
# An optional second word picks one service (the fault tests restart one at a time).
only="${2:-all}"
usage="usage: $0 up|down|status [postgres|redis|rabbitmq|pgbouncer]"
case "$only" in all|postgres|redis|rabbitmq|pgbouncer) ;; *) echo "$usage" >&2; exit 2 ;; esac
want() { [ "$only" = all ] || [ "$only" = "$1" ]; }
case "${1:-}" in
    up)     if want postgres; then pg_up; fi; if want redis; then redis_up; fi
            if want rabbitmq; then rmq_up; fi
            # Only on request: the demo and a first set-up have no PgBouncer installed.
            if [ "$only" = pgbouncer ]; then pgb_up; fi ;;
    down)   if want pgbouncer; then pgb_down; fi; if want rabbitmq; then rmq_down; fi
            if want redis; then redis_down; fi; if want postgres; then pg_down; fi ;;
    status) rc=0; if want postgres; then pg_status || rc=3; fi; if want redis; then redis_status || rc=3; fi
            if want rabbitmq; then rmq_status || rc=3; fi; exit "$rc" ;;
    *)      echo "$usage" >&2; exit 2 ;;
esac
