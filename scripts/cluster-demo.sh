#!/usr/bin/env bash
# A three-node wheel cluster on this machine: its own etcd, the installed
# PostgreSQL (a fresh schema, dropped at the end), three `wheelctl serve
# --cluster` nodes and two workers holding a stream to each. Submits a few jobs
# through one node, shows which node fired each (its shard's owner), then
# SIGKILLs a node and shows its shards moving and the jobs going on.
# Everything it started is stopped on exit, Ctrl-C included.
#
# Needs ./scripts/bootstrap.sh first (run again here: it does nothing when done).
# PostgreSQL: WHEEL_PG_DSN (default: WHEEL_TEST_PG_DSN, else
# postgresql://postgres@127.0.0.1:5432/test).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/bootstrap.sh"
py="$root/.venv/bin/python"
wheelctl="$root/.venv/bin/wheelctl"
dsn="${WHEEL_PG_DSN:-${WHEEL_TEST_PG_DSN:-postgresql://postgres@127.0.0.1:5432/test}}"
ttl=3

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# etcd: Debian's etcd-server when missing (its own service stays off: ours runs here).
if ! command -v etcd >/dev/null 2>&1; then
  echo "installing Debian's etcd-server ..." >&2
  as_root apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q etcd-server >/dev/null
  as_root systemctl disable --now etcd >/dev/null 2>&1 || true
fi
# PostgreSQL: start the installed cluster when it is stopped.
if command -v pg_lsclusters >/dev/null 2>&1; then
  while read -r ver name _port status _rest; do
    if [ "$status" != "online" ]; then
      as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start || true
    fi
  done < <(pg_lsclusters --no-header 2>/dev/null)
fi

tmp=$(mktemp -d -t wheel-cluster-demo-XXXXXX)
schema="wheel_demo_$(od -An -N4 -tx4 /dev/urandom | tr -d ' ')"
pids=()
cleanup() {
  set +e
  echo
  echo "== stopping everything"
  for pid in "${pids[@]}"; do kill -CONT "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  "$py" -c 'import sys, psycopg; psycopg.connect(sys.argv[1], autocommit=True).execute(
    f"DROP SCHEMA IF EXISTS \"{sys.argv[2]}\" CASCADE")' "$dsn" "$schema" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$py" -c 'import sys, psycopg; psycopg.connect(sys.argv[1], autocommit=True).execute(
  f"CREATE SCHEMA \"{sys.argv[2]}\"")' "$dsn" "$schema"
sep='?'; case "$dsn" in *\?*) sep='&' ;; esac
store="${dsn}${sep}options=-csearch_path%3D${schema}"

client_port=$(free_port); peer_port=$(free_port)
etcd --name=demo --data-dir="$tmp/etcd" \
  --listen-client-urls="http://127.0.0.1:$client_port" --advertise-client-urls="http://127.0.0.1:$client_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="demo=http://127.0.0.1:$peer_port" --initial-cluster-state=new \
  >"$tmp/etcd.log" 2>&1 &
pids+=($!)
echo "== etcd on 127.0.0.1:$client_port, PostgreSQL schema $schema, logs in $tmp"

targets=()
node_pids=()
# One secrets key for the three: any of them signs a secret made through another.
head -c 32 /dev/urandom | base64 >"$tmp/secrets.key"
for i in 1 2 3; do
  port=$(free_port)
  targets+=("127.0.0.1:$port")
  "$wheelctl" serve --cluster "etcd://127.0.0.1:$client_port/demo" --store "$store" \
    --node-id "node-$i" --listen "127.0.0.1:$port" --lease-ttl "$ttl" \
    --data-dir "$tmp/node-$i" --no-checkpoint --secrets-key-file "$tmp/secrets.key" \
    >"$tmp/node-$i.log" 2>&1 &
  pids+=($!); node_pids+=($!)
done
for t in "${targets[@]}"; do
  for _ in $(seq 100); do "$wheelctl" status --target "$t" >/dev/null 2>&1 && break; sleep 0.2; done
done
echo "== three nodes: ${targets[*]} (etcd lease TTL ${ttl} s)"

worker_targets=()
for t in "${targets[@]}"; do worker_targets+=(--target "$t"); done
for w in 1 2; do
  WHEEL_DEMO_WORKER="w$w" "$wheelctl" worker "${worker_targets[@]}" --worker-id "w$w" \
    wheel.demo:hello >"$tmp/worker-$w.log" 2>&1 &
  pids+=($!)
done

# Which node holds each shard under which epoch, remembered across calls (a
# dead node answers nothing, but its old fences still name it), and where
# each job's runs fired: a run's fence is (epoch << 32) | counter.
cat >"$tmp/where.py" <<'PY'
import json, sys, time
from pathlib import Path
from wheel.client import Client
from wheel.errors import WheelError

state_path, mode, *targets = sys.argv[1:]
state = Path(state_path)
seen = json.loads(state.read_text()) if state.exists() else {}

def look():
    held = {}
    for target in targets:
        try:
            with Client(target, timeout=2) as c:
                st = c.status(include_shards=True)
        except WheelError:
            continue
        mine = {s.shard: s.epoch for s in st.shards if s.epoch}
        held[st.node_id] = len(mine)
        for shard, epoch in mine.items():
            seen[f"{shard}/{epoch}"] = st.node_id
    state.write_text(json.dumps(seen))
    return held

if mode == "shards":
    held = look()
    print("   " + ", ".join(f"{n} holds {k}" for n, k in sorted(held.items()))
          + f"  (total {sum(held.values())} of 256)")
elif mode == "wait-whole":  # until the answering nodes hold all 256 again
    t0 = time.time()
    while True:
        held = look()
        print(f"   +{time.time() - t0:4.1f} s: " + ", ".join(
            f"{n} holds {k}" for n, k in sorted(held.items())), flush=True)
        if sum(held.values()) == 256:
            break
        time.sleep(0.5)
elif mode == "where":
    look()
    jobs = json.loads(Path(state_path + ".jobs").read_text())
    with Client(targets[0], timeout=5) as c:
        for job_id in jobs:
            job = c.get(job_id)
            runs = sorted(c.runs(job_id), key=lambda r: r.scheduled_for)
            fired = [
                f"{r.scheduled_for:%H:%M:%S} "
                + (seen.get(f"{job.shard}/{r.fence >> 32}", "?") if r.run_id
                   else f"missed ({r.missed_reason})")
                for r in runs
            ][-6:]
            print(f"   job {job_id} ({job.name}, shard {job.shard}): " + "; ".join(fired))
PY
where() { "$py" "$tmp/where.py" "$tmp/seen.json" "$1" "${targets[@]}"; }

echo "== the shards, split between the nodes by rendezvous hashing over etcd"
where shards

echo "== nine jobs, every 2 s, all submitted through node-1 (${targets[0]})"
jobs=()
for i in 1 2 3 4 5 6 7 8 9; do
  out=$("$wheelctl" submit --target "${targets[0]}" --json --name "demo-$i" --handler hello \
    --every 2s --payload "job $i")
  jobs+=("$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["job_id"])' "$out")")
done
printf '%s\n' "${jobs[@]}" | "$py" -c 'import json, sys; print(json.dumps([int(l) for l in sys.stdin]))' \
  >"$tmp/seen.json.jobs"
sleep 7
echo "== where each job fired: its last fires, each with the node whose epoch its fence carries"
where where

echo "== SIGKILL node-2: etcd forgets it when its lease runs out (about ${ttl} s)"
{ kill -KILL "${node_pids[1]}" && wait "${node_pids[1]}"; } 2>/dev/null || true
where wait-whole

sleep 5
echo "== the jobs go on: node-2's shards fire on their new owners (a fire due while no"
echo "   node held its shard runs late, or is recorded missed if its catch-up policy says so)"
where where
echo "== done"
