#!/usr/bin/env bash
# Build (or reuse) a throwaway environment with one engine release, outside the project venv:
#   conformance/make_env.sh vllm 0.33.0   ->  prints the environment's python
#   conformance/make_env.sh dynamo 1.6.1  ->  NVIDIA Dynamo's mocker: ai-dynamo + ai-dynamo-runtime (both --no-deps;
#                                            ai-dynamo's aisimulate dependency is not installable here and not needed
#                                            by dynamo.replay.run_trace_replay)
# Wheels and environments live in $KVHIT_CONFORMANCE_CACHE (default ~/.cache/kvhit-conformance) and are
# reused between runs; an environment is rebuilt when its requirements file changed or it is incomplete.
set -euo pipefail
pkg=$1 ver=$2
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVHIT_CONFORMANCE_CACHE:-$HOME/.cache/kvhit-conformance}
reqs=$here/requirements-$pkg.txt
venv=$cache/venv-$pkg-$ver
mkdir -p "$cache/wheels"
case $pkg in  # the distributions installed with --no-deps (their wheels' file-name prefixes)
  dynamo) dists="ai-dynamo ai-dynamo-runtime" ;;
  *) dists=$pkg ;;
esac
if [ -f "$venv/.kvhit-ok" ] && cmp -s "$reqs" "$venv/.kvhit-ok"; then
  echo "$venv/bin/python"; exit 0
fi
{
  whls=()
  for d in $dists; do
    w=${d//-/_}
    ls "$cache/wheels/$w-$ver-"*.whl >/dev/null 2>&1 \
      || pip download --quiet --no-deps --only-binary=:all: -d "$cache/wheels" "$d==$ver"
    whls+=("$cache/wheels/$w-$ver-"*.whl)
  done
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --no-deps "${whls[@]}"
  "$venv/bin/pip" install --quiet -r "$reqs"
  "$venv/bin/pip" freeze > "$venv/freeze.txt"
  cp "$reqs" "$venv/.kvhit-ok"
} >&2
echo "$venv/bin/python"
