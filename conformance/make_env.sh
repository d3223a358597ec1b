#!/usr/bin/env bash
# Build (or reuse) a throwaway environment with one engine release, outside the project venv:
#   conformance/make_env.sh vllm 0.33.0   ->  prints the environment's python
# Wheels and environments live in $KVHIT_CONFORMANCE_CACHE (default ~/.cache/kvhit-conformance) and are
# reused between runs; an environment is rebuilt when its requirements file changed or it is incomplete.
set -euo pipefail
pkg=$1 ver=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVHIT_CONFORMANCE_CACHE:-$HOME/.cache/kvhit-conformance}
reqs=$here/requirements-$pkg.txt
venv=$cache/venv-$pkg-$ver
mkdir -p "$cache/wheels"
if [ -f "$venv/.kvhit-ok" ] && cmp -s "$reqs" "$venv/.kvhit-ok"; then
  echo "$venv/bin/python"; exit 0
fi
{
  ls "$cache/wheels/$pkg-$ver-"*.whl >/dev/null 2>&1 \
    || pip download --quiet --no-deps --only-binary=:all: -d "$cache/wheels" "$pkg==$ver"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps "$cache/wheels/$pkg-$ver-"*.whl
  "$venv/bin/pip" install --quiet -r "$reqs"
  "$venv/bin/pip" freeze > "$venv/freeze.txt"
  cp "$reqs" "$venv/.kvhit-ok"
} >&2
echo "$venv/bin/python"
