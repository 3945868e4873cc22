#!/usr/bin/env bash
# Make sure PostgreSQL (127.0.0.1:5432, trust auth for local TCP), PgBouncer in front of it
# (127.0.0.1:6432, transaction pooling, any database by its own name) and Redis (127.0.0.1:6379)
# are running: start them when installed but stopped, install them with apt when absent; and
# that bubblewrap (`bwrap`, the workers' job sandbox) and nftables (`nft`, their network
# fence) are installed.
# Needs root only when something has to be installed or started.
set -euo pipefail

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }
apt_updated=0
apt_install() {
  [ "$apt_updated" = 1 ] || { apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "services: installing PostgreSQL" >&2
    apt_install postgresql postgresql-client
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  hba=/etc/postgresql/$version/main/pg_hba.conf
  if ! grep -q "torchyard-test" "$hba"; then
    # Tests connect as postgres over loopback without a password, as on the dev machines.
    sed -i '1i host all all 127.0.0.1/32 trust # torchyard-test\nhost all all ::1/128 trust # torchyard-test' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
  pg_up || { echo "services: PostgreSQL did not start" >&2; exit 1; }
fi

# The suite runs several API servers, Celery workers, controllers and the fleet bench's smoke at
# once (4 xdist workers, each process with its own pool): at its peak that is more than
# Postgres' default 100 connections ("sorry, too many clients already" failed a CI run). A test
# host gets 300; production sizes its own (README's Deployment: PgBouncer in front).
max_connections=$(psql -h 127.0.0.1 -U postgres -Atc 'SHOW max_connections' 2>/dev/null || echo 0)
if [ "${max_connections:-0}" -lt 300 ]; then
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$version" ] && [ "$(id -u)" = 0 ]; then
    psql -h 127.0.0.1 -U postgres -qc 'ALTER SYSTEM SET max_connections = 300'
    pg_ctlcluster --skip-systemctl-redirect "$version" main restart
    for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
    pg_up || { echo "services: PostgreSQL did not restart" >&2; exit 1; }
  else
    echo "services: PostgreSQL allows $max_connections connections; the suite may need 300" \
      "(as root this script raises it)" >&2
  fi
fi

# PgBouncer as production puts it between the API and workers and Postgres (README's
# Deployment; the controller connects directly): the tests of that path and bench/fleet.py
# connect through it. Trust auth as Postgres' own on loopback; postgres may use its admin
# console (`psql -h 127.0.0.1 -p 6432 -U postgres pgbouncer -c 'SHOW POOLS'`).
pgbouncer_up() { pg_isready -q -h 127.0.0.1 -p 6432 2>/dev/null; }
if ! pgbouncer_up; then
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    echo "services: installing PgBouncer" >&2
    apt_install pgbouncer
  fi
  # Root (CI) keeps it beside the package's files and runs it as postgres (PgBouncer refuses
  # to run as root); anyone else in a directory of their own, as themselves.
  if [ "$(id -u)" = 0 ]; then dir=/etc/pgbouncer; user=(-u postgres); else
    dir=${XDG_RUNTIME_DIR:-/tmp}/torchyard-pgbouncer; user=(); fi
  mkdir -p "$dir"
  echo '"postgres" ""' > "$dir/torchyard-users.txt"
  cat > "$dir/torchyard.ini" <<INI
[databases]
* = host=127.0.0.1 port=5432
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
unix_socket_dir =
auth_type = trust
auth_file = $dir/torchyard-users.txt
admin_users = postgres
stats_users = postgres
pool_mode = transaction
default_pool_size = 20
max_client_conn = 4000
server_idle_timeout = 60
logfile = $dir/torchyard.log
pidfile = $dir/torchyard.pid
INI
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  /usr/sbin/pgbouncer -d "${user[@]}" "$dir/torchyard.ini"
  for _ in $(seq 1 40); do pgbouncer_up && break; sleep 0.25; done
  pgbouncer_up || { echo "services: PgBouncer did not start" >&2; exit 1; }
fi

if ! redis_up; then
  if ! command -v redis-server >/dev/null; then
    echo "services: installing Redis" >&2
    apt_install redis-server
  fi
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/torchyard.log
  for _ in $(seq 1 60); do redis_up && break; sleep 0.25; done
  redis_up || { echo "services: Redis did not start" >&2; exit 1; }
fi
# Workers run every job's ranks in a bubblewrap sandbox (workers/isolation/sandbox.py).
if ! command -v bwrap >/dev/null; then
  echo "services: installing bubblewrap" >&2
  apt_install bubblewrap
fi

# ... and fence the jobs that keep the network off the control plane with nftables
# (workers/isolation/netfence.py; needs root where the worker runs).
if ! command -v nft >/dev/null && [ ! -x /usr/sbin/nft ]; then
  echo "services: installing nftables" >&2
  apt_install nftables
fi
echo "services: postgres, pgbouncer, redis, bwrap and nft are up" >&2
