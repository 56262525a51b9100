#!/usr/bin/env bash
# Makes sure the services the tests talk to are running: PostgreSQL on 5432 (trust
# auth for local connections, database `test`) and RabbitMQ on 5672 (guest/guest).
# Installs what is missing from Debian's packages (and the curl and git that .ci/run
# uses). S3: the tests start s3rver themselves; in CI (or with RUNNER_DEPOT_CEPH=1) this also
# starts radosgw on a one-node Ceph (test/setup/ceph-rgw.sh), which .ci/run runs the S3
# tests against once more (docs/decisions/s3-servers.md).
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() { for _ in $(seq 1 120); do listening "$1" && return 0; sleep 1; done; echo "port $1 did not open" >&2; return 1; }
updated=0
apt_install() {
  if [ "$updated" = 0 ]; then apt-get update -qq; updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

missing=()
for tool in curl git; do command -v "$tool" >/dev/null || missing+=("$tool"); done
# The agent fetch's test runs the script with Debian's own curl, wget and python3 each alone.
command -v wget >/dev/null || missing+=(wget)
[ -x /usr/bin/python3 ] || missing+=(python3)
[ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}" ca-certificates

# PostgreSQL: a server from Debian's packages with local connections trusted. The trust
# rules go into pg_hba.conf only in CI or in a cluster this script has just created by
# installing the package: a developer's own cluster is never edited (npm test then uses
# its embedded PostgreSQL, or the URL in RUNNER_DEPOT_TEST_POSTGRES).
in_ci() { case "${CI:-}" in "" | false | 0) return 1 ;; *) return 0 ;; esac; }
postgres_ok=1
if ! listening 5432 || ! psql -h 127.0.0.1 -U postgres -tAc 'select 1' >/dev/null 2>&1; then
  created=0
  if ! command -v pg_ctlcluster >/dev/null; then apt_install postgresql; created=1; fi
  command -v psql >/dev/null || apt_install postgresql-client
  ver=$(ls /etc/postgresql | sort -V | tail -n1)
  hba=/etc/postgresql/$ver/main/pg_hba.conf
  if grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    :
  elif in_ci || [ "$created" = 1 ]; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
  else
    echo "services: not CI and not a cluster made here, so $hba is left as it is; npm test will use" >&2
    echo "          an embedded PostgreSQL, or set RUNNER_DEPOT_TEST_POSTGRES to a URL that logs in" >&2
    postgres_ok=0
  fi
  # Installing may already have started the cluster (systemd): then reload picks up the
  # new rules; otherwise start it.
  if [ "$postgres_ok" = 0 ]; then
    :
  elif pg_ctlcluster --skip-systemctl-redirect "$ver" main status >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
    wait_port 5432
  else
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start
    wait_port 5432
  fi
fi
if [ "$postgres_ok" = 1 ]; then
  psql -h 127.0.0.1 -U postgres -tAc "select 1 from pg_database where datname='test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c 'create database test' >/dev/null
fi

# RabbitMQ: the Debian server, default guest/guest (allowed from localhost).
if ! listening 5672; then
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  rabbitmq-server -detached || true
  wait_port 5672
fi
command -v rabbitmqctl >/dev/null || { echo "rabbitmqctl missing (the restart test needs it)" >&2; exit 1; }

# Chromium for the web console's browser tests (driven by playwright-core, which needs
# the browser itself: Debian's package, never a download of Playwright's own build).
command -v chromium >/dev/null || apt_install chromium
# Debian's securesystemslib, the independent DSSE verifier of the signed-version tests
# (test/depot/signing/independent-verifiers.test.ts runs it with /usr/bin/python3).
/usr/bin/python3 -c 'import securesystemslib.signer' 2>/dev/null || apt_install python3-securesystemslib
# Debian's PyYAML, the parser cloud-init reads user data with (test/runner/agent/cloud-init-yaml11.test.ts).
/usr/bin/python3 -c 'import yaml' 2>/dev/null || apt_install python3-yaml
# Debian's grpcio, protobuf and protoc: the independent Python gRPC client of
# test/runner/interop-grpcio.test.ts, built from the seed's proto (an older client).
/usr/bin/python3 -c 'import grpc, google.protobuf' 2>/dev/null || apt_install python3-grpcio python3-protobuf
command -v protoc >/dev/null || apt_install protobuf-compiler
# The VM test (npm run test:vm, docs/decisions/single-file-agent.md): QEMU, debootstrap for
# its image, vfat tools for the NoCloud seed, socat for guestfwd, qemu-user and the arm64
# libraries the arm64 agent (a dynamically linked Node) loads. In CI, or when asked.
if in_ci || [ "${RUNNER_DEPOT_VM:-}" = 1 ]; then
  vm_missing=()
  for pair in qemu-system-x86_64:qemu-system-x86 qemu-aarch64:qemu-user debootstrap:debootstrap \
    mkfs.vfat:dosfstools mcopy:mtools socat:socat xz:xz-utils mkfs.ext4:e2fsprogs; do
    command -v "${pair%%:*}" >/dev/null || vm_missing+=("${pair#*:}")
  done
  [ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] \
    || vm_missing+=(libc6-arm64-cross libstdc++6-arm64-cross libgcc-s1-arm64-cross)
  [ ${#vm_missing[@]} -eq 0 ] || apt_install "${vm_missing[@]}"
fi
# radosgw (Ceph 16.2 from Debian): about 25 s to install and 20 s to create on a clean
# machine, 7 s to start again; it writes /var/lib/runner-depot-ceph/s3.env.
s3_state=""
if in_ci || [ "${RUNNER_DEPOT_CEPH:-}" = 1 ]; then
  bash "$(dirname "$0")/../test/setup/ceph-rgw.sh" >/dev/null
  s3_state=", radosgw on 127.0.0.1:${RUNNER_DEPOT_CEPH_PORT:-7480}"
fi
if [ "$postgres_ok" = 1 ]; then postgres_state="postgresql and rabbitmq are up"; else postgres_state="rabbitmq is up, postgresql left alone"; fi
echo "services: $postgres_state$s3_state, chromium at $(command -v chromium)"
