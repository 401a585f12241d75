#!/usr/bin/env bash
# One command for a fresh machine: install, then run a server, two workers and sample jobs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/wheelctl" demo "$@"
