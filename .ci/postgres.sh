#!/usr/bin/env bash
# Bring up a local PostgreSQL for the gpupool test suite (Debian/Ubuntu, run as root).
#
# Why: the store must behave the same on SQLite and PostgreSQL; the PG tests skip
# unless GPUPOOL_TEST_PG_URL points at a reachable server. This script makes one,
# idempotently, and prints the URL to export. It exports nothing itself.
#
#   eval "$(.ci/postgres.sh --export)"   # or: export GPUPOOL_TEST_PG_URL=$(.ci/postgres.sh | tail -1)
set -euo pipefail

PGUSER_NAME="${PGUSER_NAME:-gpupool}"
PGPASS="${PGPASS:-gpupool}"
PGDB="${PGDB:-gpupool_test}"
PGPORT="${PGPORT:-5432}"

log() { echo "postgres.sh: $*" >&2; }

as_postgres() {
  if [ "$(id -u)" = "0" ]; then
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else
    sudo -u postgres "$@"
  fi
}

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  log "installing postgresql with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi

PGVER="$(ls /usr/lib/postgresql | sort -V | tail -1)"
PGBIN="/usr/lib/postgresql/${PGVER}/bin"

if command -v pg_ctlcluster >/dev/null 2>&1; then
  if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -q "^${PGVER} main$"; then
    log "creating cluster ${PGVER}/main"
    pg_createcluster "${PGVER}" main --port "${PGPORT}" >&2
  fi
  if ! pg_lsclusters -h | awk -v v="${PGVER}" '$1==v && $2=="main" {print $4}' | grep -q online; then
    log "starting cluster ${PGVER}/main"
    pg_ctlcluster "${PGVER}" main start >&2
  fi
else
  DATA="${PGDATA:-/var/lib/postgresql/gpupool-data}"
  mkdir -p "${DATA}" && chown postgres:postgres "${DATA}"
  if [ ! -f "${DATA}/PG_VERSION" ]; then
    as_postgres "${PGBIN}/initdb" -D "${DATA}" -A scram-sha-256 --auth-local=peer -U postgres >&2
  fi
  mkdir -p /var/run/postgresql && chown postgres:postgres /var/run/postgresql
  if ! as_postgres "${PGBIN}/pg_ctl" -D "${DATA}" status >/dev/null 2>&1; then
    as_postgres "${PGBIN}/pg_ctl" -D "${DATA}" -o "-p ${PGPORT} -k /var/run/postgresql" -l "${DATA}/server.log" -w start >&2
  fi
fi

# Wait until it accepts connections.
for _ in $(seq 1 30); do
  if as_postgres psql -p "${PGPORT}" -tAc 'select 1' >/dev/null 2>&1; then break; fi
  sleep 1
done

as_postgres psql -p "${PGPORT}" -v ON_ERROR_STOP=1 -q >&2 <<SQL
DO \$\$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '${PGUSER_NAME}') THEN
    CREATE ROLE ${PGUSER_NAME} LOGIN PASSWORD '${PGPASS}';
  ELSE
    ALTER ROLE ${PGUSER_NAME} LOGIN PASSWORD '${PGPASS}';
  END IF;
END
\$\$;
SQL
if ! as_postgres psql -p "${PGPORT}" -tAc "SELECT 1 FROM pg_database WHERE datname='${PGDB}'" | grep -q 1; then
  as_postgres createdb -p "${PGPORT}" -O "${PGUSER_NAME}" "${PGDB}" >&2
fi
# Tests create one schema per test; the role owns the database so it may.
as_postgres psql -p "${PGPORT}" -q -d "${PGDB}" -c "GRANT ALL ON SCHEMA public TO ${PGUSER_NAME}" >&2

URL="postgresql+psycopg://${PGUSER_NAME}:${PGPASS}@127.0.0.1:${PGPORT}/${PGDB}"
if [ "${1:-}" = "--export" ]; then
  echo "export GPUPOOL_TEST_PG_URL='${URL}'"
else
  echo "${URL}"
fi
