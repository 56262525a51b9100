#!/usr/bin/env bash
# A one-node Ceph cluster with radosgw, the S3 server many sites really run (issue 28;
# why and what it verifies: docs/decisions/s3-servers.md). One mon, one mgr, one OSD
# (bluestore on a sparse file, no disk or loop device), pools of size 1, radosgw on
# 127.0.0.1 only, and one S3 user with fixed keys. Idempotent: a first run installs
# Debian's packages if missing and creates the cluster (cold start); later runs start the
# daemons of the cluster already there (warm start); a run while it is up only checks it.
#
#   test/setup/ceph-rgw.sh           start (or check), then print the endpoint and keys
#   test/setup/ceph-rgw.sh --stop    stop the daemons this script started (by pid file)
#   test/setup/ceph-rgw.sh --purge   stop, then remove the cluster's data
#
# Environment: RUNNER_DEPOT_CEPH_DIR (default /var/lib/runner-depot-ceph, outside the repo),
# RUNNER_DEPOT_CEPH_PORT (radosgw, default 7480), RUNNER_DEPOT_CEPH_OSD_GIB (default 16,
# sparse). It writes $DIR/s3.env with RUNNER_DEPOT_TEST_S3 (http://KEY:SECRET@host:port),
# which the S3 tests and benches take (test/fixtures/backends.ts, bench/s3-servers.ts).
# Memory: osd_memory_target 1 GiB, small caches everywhere; the machine is shared.
set -euo pipefail

DIR=${RUNNER_DEPOT_CEPH_DIR:-/var/lib/runner-depot-ceph}
PORT=${RUNNER_DEPOT_CEPH_PORT:-7480}
OSD_GIB=${RUNNER_DEPOT_CEPH_OSD_GIB:-16}
MON_PORT=${RUNNER_DEPOT_CEPH_MON_PORT:-6789}
MON_V2_PORT=${RUNNER_DEPOT_CEPH_MON_V2_PORT:-3300}
ACCESS_KEY=RUNNERDEPOTTESTKEY01
SECRET_KEY=runner-depot-test-secret-not-a-secret-0001
CONF=$DIR/ceph.conf
export CEPH_CONF=$CONF
started_at=$(date +%s.%N)

say() { echo "ceph-rgw: $*" >&2; }
elapsed() { awk -v a="$started_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Whether the pid file names a live process of that daemon (a stale file after a reboot may
# name some other process now: that one is never signalled).
pid_alive() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
daemon_of() { case "$1" in client.rgw.*) echo radosgw ;; osd.*) echo ceph-osd ;; mgr.*) echo ceph-mgr ;; mon.*) echo ceph-mon ;; esac; }

stop_all() {
  local stopped=0
  # radosgw first, the OSD before the mon: each goes down while what it reports to is up.
  for name in client.rgw.a osd.0 mgr.x mon.a; do
    local pidfile=$DIR/run/$name.pid
    if pid_alive "$pidfile" "$(daemon_of "$name")"; then
      local pid
      pid=$(cat "$pidfile")
      kill "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && { say "$name ($pid) ignored TERM for 10 s, killing"; kill -9 "$pid"; }
      stopped=$((stopped + 1))
    fi
    rm -f "$pidfile"
  done
  say "stopped $stopped daemon(s) in $(elapsed) s"
}

case "${1:-}" in
  --stop) stop_all; exit 0 ;;
  --purge) stop_all; rm -rf "$DIR"; say "removed $DIR"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--stop|--purge]" >&2; exit 2 ;;
esac

# Debian bookworm ships Ceph 16.2 (Pacific).
need=()
for pair in ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd radosgw:radosgw ceph:ceph-common \
  radosgw-admin:ceph-common monmaptool:ceph-base curl:curl python3:python3; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

write_conf() {
  local fsid=$1
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_PORT]
public_addr = 127.0.0.1
public_network = 127.0.0.0/8
ms_bind_ipv6 = false
# A throw-away cluster reachable on loopback only: no cephx keys to carry around.
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
# Without cephx there is no "secure" mode; radosgw asks for it towards the mon by default.
ms_mon_client_mode = crc
ms_client_mode = crc
run_dir = $DIR/run
pid_file = $DIR/run/\$name.pid
admin_socket = $DIR/run/\$name.asok
log_file = $DIR/log/\$name.log
mon_cluster_log_file = $DIR/log/cluster.log
keyring = $DIR/keyring
# One OSD: pools of one copy, placement across OSDs (not hosts), and no warnings about it.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
mon_warn_on_insecure_global_id_reclaim_allowed = false
mon_allow_pool_delete = true
mon_max_pg_per_osd = 500
mon_data_avail_warn = 2
mon_data_avail_crit = 1
# Small footprint: 2 cores and 8 engineers on this machine.
osd_memory_target = 1073741824
osd_op_num_shards = 1
osd_op_num_threads_per_shard = 2
mon_memory_target = 268435456
rocksdb_cache_size = 67108864

[mon]
mon_data = $DIR/mon/\$cluster-\$id

[mgr]
mgr_data = $DIR/mgr/\$cluster-\$id
# Only the modules Pacific always runs; no dashboard, no prometheus.
mgr_initial_modules =

[osd]
osd_data = $DIR/osd/\$cluster-\$id
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = $((OSD_GIB * 1024 * 1024 * 1024))
bluestore_block_db_create = false
bluestore_block_wal_create = false
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
osd_max_object_size = 134217728

[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:$PORT
rgw_data = $DIR/rgw/\$cluster-\$id
rgw_thread_pool_size = 64
rgw_enable_usage_log = false
rgw_dns_name = 127.0.0.1
# Garbage collection within seconds, not hours: a deleted object's space is only freed by
# radosgw's gc (defaults: eligible after 2 h, a pass every hour), and tests and benches that
# delete their buckets refill the small OSD in a few runs otherwise.
$(gc_settings)
EOF
}

# The gc settings, "key = value" a line: written into the conf and pushed into a running
# radosgw (apply_gc), so a warm start gets them without a restart.
gc_settings() {
  printf '%s\n' "rgw_gc_obj_min_wait = 2" "rgw_gc_processor_period = 5" "rgw_gc_processor_max_time = 5"
}

start_mon() {
  pid_alive "$DIR/run/mon.a.pid" ceph-mon || ceph-mon -i a
}
start_mgr() {
  pid_alive "$DIR/run/mgr.x.pid" ceph-mgr || ceph-mgr -i x
}
start_osd() {
  pid_alive "$DIR/run/osd.0.pid" ceph-osd || ceph-osd -i 0
}
start_rgw() {
  pid_alive "$DIR/run/client.rgw.a.pid" radosgw || radosgw -n client.rgw.a
}

# Waits until `ceph` answers and says HEALTH_OK or HEALTH_WARN with the OSD up and in.
wait_cluster() {
  local out=""
  for _ in $(seq 1 180); do
    out=$(timeout 10 ceph status --format json 2>/dev/null || true)
    if [ -n "$out" ] && python3 - "$out" <<'EOF'; then return 0; fi
import json, sys
s = json.loads(sys.argv[1])
ok = s["health"]["status"] in ("HEALTH_OK", "HEALTH_WARN")
osd = s["osdmap"]
sys.exit(0 if ok and osd["num_up_osds"] >= 1 and osd["num_in_osds"] >= 1 else 1)
EOF
    sleep 1
  done
  say "the cluster did not become healthy in 180 s; last status:"
  timeout 10 ceph status >&2 || true
  return 1
}

# Waits until radosgw answers an S3 request (an anonymous ListBuckets answers 200).
wait_rgw() {
  for _ in $(seq 1 180); do
    if curl -fs -o /dev/null --max-time 5 "http://127.0.0.1:$PORT/"; then return 0; fi
    pid_alive "$DIR/run/client.rgw.a.pid" radosgw || { say "radosgw exited; see $DIR/log/client.rgw.a.log"; return 1; }
    sleep 1
  done
  say "radosgw did not answer on 127.0.0.1:$PORT in 180 s"
  return 1
}

# A radosgw started before this version of the conf keeps its gc settings until restarted:
# set them through its admin socket (the worker's current sleep, up to the old period, ends
# first; deletions from now on are eligible after the new wait).
apply_gc() {
  local key value
  while IFS=' =' read -r key value; do
    timeout 10 ceph --admin-daemon "$DIR/run/client.rgw.a.asok" config set "$key" "$value" >/dev/null \
      || say "could not set $key on the running radosgw"
  done < <(gc_settings)
}

mode=warm
if [ ! -e "$DIR/created" ]; then
  mode=cold
  say "creating a one-node cluster in $DIR"
  # A creation cut short earlier: stop what it left running before starting over.
  [ -d "$DIR/run" ] && stop_all
  rm -rf "$DIR"
  mkdir -p "$DIR"/{run,log,mon,mgr,osd,rgw}
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$fsid"
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_PORT]" \
    "$DIR/monmap" >/dev/null
  ceph-mon --mkfs -i a --monmap "$DIR/monmap"
  start_mon
  mkdir -p "$DIR/mgr/ceph-x"
  start_mgr
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  osd_id=$(timeout 60 ceph osd new "$osd_uuid")
  [ "$osd_id" = 0 ] || { say "expected osd.0, got osd.$osd_id"; exit 1; }
  mkdir -p "$DIR/osd/ceph-0"
  ceph-osd -i 0 --mkfs --osd-uuid "$osd_uuid" 2>"$DIR/log/osd-mkfs.log" \
    || { cat "$DIR/log/osd-mkfs.log" >&2; exit 1; }
  start_osd
else
  # The settings of this script's version; the cluster's identity stays.
  mkdir -p "$DIR/run"
  write_conf "$(sed -n 's/^fsid = //p' "$CONF")"
  start_mon
  start_mgr
  start_osd
fi
wait_cluster
say "cluster healthy after $(elapsed) s"
start_rgw
wait_rgw
apply_gc
if [ "$mode" = cold ]; then
  timeout 60 radosgw-admin user create --uid=runner-depot --display-name="runner-depot tests" \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null
  touch "$DIR/created"
fi
cat >"$DIR/s3.env" <<EOF
RUNNER_DEPOT_TEST_S3=http://$ACCESS_KEY:$SECRET_KEY@127.0.0.1:$PORT
EOF
say "$mode start: radosgw answers on http://127.0.0.1:$PORT after $(elapsed) s"
cat "$DIR/s3.env"
