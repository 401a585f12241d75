#!/usr/bin/env bash
# Builds the images compose.yaml runs, from Debian's packages alone: no
# container registry is needed.
#
#   wheel-scheduler-base:bookworm   a minimal Debian bookworm made by
#                                   debootstrap and imported (made once; needs
#                                   root and debootstrap)
#   wheel-scheduler:VERSION, :latest  wheelctl in a virtualenv on bookworm's
#                                   Python, run as a user of its own
#   wheel-scheduler-etcd, -postgres, -prometheus:bookworm
#                                   Debian's etcd-server, postgresql-15 and
#                                   prometheus on the same base
#
# Usage: ops/container/build.sh [WHEEL]
#   WHEEL: a built wheel_scheduler-*.whl for CPython 3.11 (bookworm's); without
#   it the wheel is built from this checkout with `python -m build`.
# Environment:
#   ENGINE         podman (default) or docker
#   PYTHON         a CPython 3.11 to build with (python3)
#   DEBIAN_MIRROR  http://deb.debian.org/debian
#   REBUILD_BASE=1 make the base image again (to pick up Debian's updates)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
engine=${ENGINE:-podman}
python=${PYTHON:-python3}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base=localhost/wheel-scheduler-base:bookworm
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n 1)

# The wheels gathered below are for the Python that gathers them: it must be
# bookworm's minor version.
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "build.sh: $python is not a CPython 3.11 (bookworm's); set PYTHON" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { echo "build.sh: $*" >&2; }

# The base: debootstrap's minimal bookworm with the security and point
# release updates applied, and no service started by a package's install.
if [ "${REBUILD_BASE:-0}" = 1 ] || ! "$engine" image inspect "$base" >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ] || ! command -v debootstrap >/dev/null 2>&1; then
    say "making $base needs root and debootstrap (apt-get install debootstrap)"
    exit 1
  fi
  say "making $base with debootstrap from $mirror ..."
  rootfs="$work/rootfs"
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { cat "$work/debootstrap.log" >&2; exit 1; }
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
  chmod 755 "$rootfs/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
  chroot "$rootfs" sh -c 'apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get upgrade -y -q' \
    >"$work/upgrade.log" 2>&1 || { cat "$work/upgrade.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  : >"$rootfs/etc/resolv.conf"
  tar --numeric-owner -C "$rootfs" -c . \
    | "$engine" import --change 'CMD ["/bin/bash"]' - "$base" >"$work/import.log" 2>&1 \
    || { cat "$work/import.log" >&2; exit 1; }
fi

# The project's wheel and every wheel it needs, so that the image installs
# with no package index.
context="$work/wheel"
mkdir -p "$context/wheels"
if [ $# -ge 1 ]; then
  whl=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
else
  say "building the wheel with python -m build ..."
  "$python" -m venv "$work/builder"
  "$work/builder/bin/pip" install -q -c "$root/requirements/lock.txt" build
  "$work/builder/bin/python" -m build -q --outdir "$work/dist" "$root" >/dev/null
  whl=$(ls "$work"/dist/wheel_scheduler-*.whl)
fi
case "$(basename "$whl")" in
  *-cp311-*|*-py3-none-any.whl) ;;
  *) say "$whl is not for CPython 3.11, bookworm's Python"; exit 1 ;;
esac
say "gathering the wheels of $(basename "$whl") and its dependencies ..."
"$python" -m pip wheel -q --wheel-dir "$context/wheels" -c "$root/requirements/lock.txt" "$whl"
cp "$here/Dockerfile" "$here/wheel-health" "$context/"

build() {  # build TAG CONTEXT [more podman build arguments]
  local tag=$1 dir=$2
  shift 2
  say "building $tag ..."
  # The docker format keeps HEALTHCHECK (the OCI format has no such field).
  local format=()
  [ "$engine" = podman ] && format=(--format docker)
  "$engine" build -q "${format[@]}" --build-arg "BASE=$base" -t "$tag" "$@" "$dir" >/dev/null
}

# The image a rebuild replaces is removed, unless a container still uses it:
# each new wheel would otherwise leave one behind.
image=localhost/wheel-scheduler:$version
old=$("$engine" image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
build "$image" "$context" -t localhost/wheel-scheduler:latest
new=$("$engine" image inspect --format '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  "$engine" rmi "$old" >/dev/null 2>&1 || true
fi
cp -r "$here/etcd" "$here/postgres" "$here/prometheus" "$work/"
cp "$root/ops/prometheus/alerts.yml" "$work/prometheus/"
for part in etcd postgres prometheus; do
  build "localhost/wheel-scheduler-$part:bookworm" "$work/$part"
done
say "done: localhost/wheel-scheduler:$version and the etcd, postgres and prometheus images"
