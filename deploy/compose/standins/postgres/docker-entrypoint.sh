#!/bin/bash
# The stand-in's entrypoint: on the first start, initdb with POSTGRES_USER as the superuser
# (password POSTGRES_PASSWORD, scram-sha-256 from other hosts) and create POSTGRES_DB; then run
# the command (`postgres ...`) listening on all the container's interfaces.
set -euo pipefail

if [[ ${1:-} == postgres ]]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    if [[ ! -s $PGDATA/PG_VERSION ]]; then
        pwfile=$(mktemp)
        printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
        initdb --username="$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
            --encoding=UTF8 -D "$PGDATA" >/dev/null
        rm -f "$pwfile"
        printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
        if [[ $db != postgres ]]; then
            pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
            psql -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres \
                -c "CREATE DATABASE \"$db\"" >/dev/null
            pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
        fi
        echo "docker-entrypoint.sh: initialised $PGDATA (user $user, database $db)"
    fi
    exec "$@" -c listen_addresses='*'
fi
exec "$@"
