#!/usr/bin/env bash
# make peer-dynamo: kvhit's Dynamo-router fleet against NVIDIA Dynamo's mocker (ai-dynamo $DYNAMO, default timing) on
# the Mooncake conversation trace, R = 2, 4 at 4k and 16k blocks of 512 tokens (docs/peers.md). Not part of
# make conformance: the mocker's router breaks ties at random without a seed, so its hit ratio varies run to run.
# Skips (exit 0, one line) when the mocker's environment cannot be built (no network, no wheel for this platform).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${KVHIT_PEER_OUT:-out/peers}
DYNAMO=${DYNAMO:-1.6.1}
TRACE=${KVHIT_PEER_TRACE:-../shared/data/traces/mooncake_fast25/conversation_trace.jsonl}
RUNS=${KVHIT_PEER_RUNS:-3}
SEEDS=${KVHIT_PEER_SEEDS:-3}
BLOCK=${KVHIT_PEER_BLOCK_SIZE:-512}
mkdir -p "$OUT"
if [ ! -f "$TRACE" ]; then
  echo "peer-dynamo: skipped: trace $TRACE not found (set KVHIT_PEER_TRACE)"; exit 0
fi
if ! py=$(conformance/make_env.sh dynamo "$DYNAMO" 2>"$OUT/make_env.log"); then
  echo "peer-dynamo: skipped: the ai-dynamo $DYNAMO environment could not be built (see $OUT/make_env.log)"; exit 0
fi
name=$(basename "$TRACE" .jsonl)
DYN_LOG=error "$py" conformance/dynamo_mocker_replay.py --trace "$TRACE" --block-size "$BLOCK" --runs "$RUNS" --probe \
  --json "$OUT/mocker-$name.json" 2>&1 | grep -v " INFO " || true
[ -s "$OUT/mocker-$name.json" ] || { echo "peer-dynamo: the mocker replay wrote nothing"; exit 1; }
export PYTHONPATH=$PWD/src NUMBA_CACHE_DIR=${KVHIT_CONFORMANCE_CACHE:-$HOME/.cache/kvhit-conformance}/numba
"${KVHIT_PYTHON:-.venv/bin/python}" conformance/check_dynamo_mocker.py --mocker-json "$OUT/mocker-$name.json" --seeds "$SEEDS" \
  --json "$OUT/check-$name.json"
