#!/usr/bin/env bash
# Makes sure the services the tests talk to are running: PostgreSQL on 5432 (trust
# auth) and RabbitMQ on 5672 (guest/guest). Installs them from Debian's packages when
# they are missing. S3 needs nothing here: the tests start s3rver themselves.
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 120); do listening "$1" && return 0; sleep 1; done; echo "port $1 did not open" >&2; return 1; }
updated=0
apt_install() {
  if [ "$updated" = 0 ]; then apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! listening 5432; then
  command -v pg_ctlcluster >/dev/null || apt_install postgresql
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  # The tests connect as postgres over TCP without a password, as on the dev machines.
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || true
  wait_port 5432
fi
psql -h 127.0.0.1 -U postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1 \
  || psql -h 127.0.0.1 -U postgres -c 'create database test' >/dev/null

if ! listening 5672; then
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  rabbitmq-server -detached || true
  wait_port 5672
fi
echo "services: postgresql and rabbitmq are up"
