#!/usr/bin/env bash
# One command for a fresh machine: install what the tests need, then lint, type-check and test.
# Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/bootstrap.sh"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# etcd: the cluster tests start their own server from this binary.
if ! command -v etcd >/dev/null 2>&1; then
  echo "installing Debian's etcd-server ..." >&2
  as_root apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q etcd-server >/dev/null
  # The package starts a system etcd on the default ports; the tests use their own.
  as_root systemctl disable --now etcd >/dev/null 2>&1 || true
fi

# chromium: the web console's browser test drives Debian's build (Playwright
# never downloads one of its own here).
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium ..." >&2
  as_root apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -q chromium >/dev/null
fi

# PostgreSQL: start the installed cluster when it is stopped.
if command -v pg_lsclusters >/dev/null 2>&1; then
  while read -r ver name _port status _rest; do
    if [ "$status" != "online" ]; then
      echo "starting PostgreSQL $ver/$name ..." >&2
      as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start || true
    fi
  done < <(pg_lsclusters --no-header 2>/dev/null)
fi

py="$root/.venv/bin"
"$py/ruff" check src tests testkit benchmarks scripts hatch_build.py
"$py/ruff" format --check src tests testkit benchmarks scripts hatch_build.py
"$py/mypy"
# The docs site (mkdocs.yml): a broken link or anchor, or a page left out of
# the navigation, fails the build. Built into a temporary directory.
site=$(mktemp -d)
docs=0
NO_MKDOCS_2_WARNING=1 "$py/mkdocs" build --strict --quiet --site-dir "$site" || docs=$?
rm -rf "$site"
[ "$docs" = 0 ] || exit "$docs"

# With arguments: one pytest run of what they name.
if [ $# -gt 0 ]; then
  exec "$py/pytest" "$@"
fi

# The whole suite in three parts: the tests of real processes (``slow``:
# node, worker, etcd processes, mostly waiting out leases and restarts; two
# shards at once) beside
# the in-process ones (CPU) and then the engine's again on the pure-Python
# fallback (the hot modules from their sources, not compiled), then, one at a
# time, the ones that must run alone (``alone``: the nemesis restarts the
# PostgreSQL every other test uses) and those that assert a promise's latency
# bound (``timed``: a planned move within a second, a failover within the TTL
# and a second, a lone fire within a third of a tick; beside two other test
# runs on two cores they measure how soon a thread gets a core, not the
# promise).
inproc=$(mktemp)
shard=$(mktemp)
trap 'rm -f "$inproc" "$shard"' EXIT
in_process() {
  local status=0
  "$py/pytest" -m "not slow and not alone and not timed" -p no:cacheprovider || status=$?
  echo "----- the engine on the pure-Python fallback -----"
  WHEEL_PURE_PYTHON=1 "$py/pytest" tests/engine tests/test_compiled.py \
    -m "not slow and not alone and not timed" -p no:cacheprovider || status=$?
  return "$status"
}
in_process >"$inproc" 2>&1 &
inproc_pid=$!
# The real-process tests as two shards side by side (a file's tests stay
# together: tests/conftest.py), the second one's output shown after.
WHEEL_TEST_SHARD=1/2 "$py/pytest" -m "slow and not alone and not timed" -p no:cacheprovider >"$shard" 2>&1 &
shard_pid=$!
status=0
WHEEL_TEST_SHARD=0/2 "$py/pytest" -m "slow and not alone and not timed" -p no:cacheprovider || status=$?
wait "$shard_pid" || status=$?
echo "----- the real-process tests' second shard -----"
cat "$shard"
wait "$inproc_pid" || status=$?
echo "----- in-process tests -----"
cat "$inproc"
"$py/pytest" -m "alone or timed" -p no:cacheprovider || status=$?
exit "$status"
