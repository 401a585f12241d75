#!/usr/bin/env bash
# Create .venv and install wheel with its pinned dependencies.
# Idempotent: re-installs only when pyproject.toml or the lock file changed.
# Never installs PyPA's `wheel` distribution: it shares our import name.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
extras="${WHEEL_EXTRAS:-dev,bench,otel}"
py="${PYTHON:-python3}"

if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "wheel needs Python >= 3.11 (found $("$py" --version 2>&1)); set PYTHON=..." >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
want=$(cat "$root/pyproject.toml" "$root/requirements/lock.txt" | sha256sum | cut -d' ' -f1)-$extras
stamp="$venv/.wheel-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing wheel-scheduler[$extras] into .venv ..." >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$root/requirements/lock.txt" -e "$root[$extras]"
  if "$venv/bin/python" -m pip show -q wheel >/dev/null 2>&1; then
    echo "removing PyPA's 'wheel' distribution: it overwrites our package" >&2
    "$venv/bin/python" -m pip uninstall -y -q wheel
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall -e "$root"
  fi
  echo "$want" >"$stamp"
fi
# The hot modules compiled with mypyc (hatch_build.py): again whenever one of
# their sources changed since the build, so the extensions never run old
# code. WHEEL_PURE_PYTHON=1 removes them (the sources run as they are).
if ! "$venv/bin/python" -c 'import sys, json
from wheel._compiled import MANIFEST, source_hashes
try:
    built = json.loads(MANIFEST.read_text())
except (OSError, ValueError):
    built = None
sys.exit(0 if built == source_hashes() else 1)' 2>/dev/null; then
  if [ -z "${WHEEL_PURE_PYTHON:-}" ]; then
    echo "compiling the hot modules (mypyc) ..." >&2
  fi
  "$venv/bin/python" "$root/hatch_build.py" >/dev/null
fi
