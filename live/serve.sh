#!/usr/bin/env bash
# Start one vLLM CPU server on 127.0.0.1 in the background and print its PID:
#   live/serve.sh PYTHON PORT BLOCK_SIZE NUM_GPU_BLOCKS LOGFILE [extra vllm flags…]
# The server holds NUM_GPU_BLOCKS blocks of BLOCK_SIZE tokens (vLLM's block 0 is its null block: N − 1 usable),
# a tiny random-weight Llama (live/model/config.json, --load-format dummy), prompts as token ids
# (--skip-tokenizer-init), prefix caching on, per-request cached_tokens (--enable-prompt-tokens-details) and timings
# (--enable-per-request-metrics: queue, first-token and generation times, for the scheduler check) and
# POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1). Every internal socket binds 127.0.0.1 (VLLM_HOST_IP).
# The engine's clock: --enable-log-requests makes the front end log "Added request <id>." as it hands each request
# to the engine core, and live/vllm_logging.json (VLLM_LOGGING_CONFIG_PATH) stamps every line with its Unix time
# (%(created).6f): `kvhit replay --server-log LOGFILE` anchors the scheduler check on it. The request logger's
# "Received request" lines (the whole prompt) are silenced there.
# --kv-cache-memory-bytes is always given (without it vLLM reserves 92 % of host RAM); the value leaves room for
# NUM_GPU_BLOCKS, which --num-gpu-blocks-override then fixes.
set -euo pipefail
py=$1 port=$2 bs=$3 nblocks=$4 log=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
# bytes per block: 2 (K,V) × layers 2 × kv heads 2 × head_dim 32 × 2 bytes (bf16) × block size
kvbytes=$(( (nblocks + 8) * 2 * 2 * 2 * 32 * 2 * bs ))
[ "$kvbytes" -lt 16777216 ] && kvbytes=16777216
VLLM_HOST_IP=127.0.0.1 VLLM_SERVER_DEV_MODE=1 VLLM_LOGGING_CONFIG_PATH=$here/vllm_logging.json VLLM_CPU_KVCACHE_SPACE=0 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-INFO} \
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} OMP_NUM_THREADS=${KVHIT_LIVE_THREADS:-1} \
  setsid "$py" -m vllm.entrypoints.openai.api_server --model "$here/model" --host 127.0.0.1 --port "$port" \
  --served-model-name tiny --load-format dummy --skip-tokenizer-init --max-model-len 4096 --enforce-eager \
  --dtype bfloat16 --enable-prefix-caching --block-size "$bs" --kv-cache-memory-bytes "$kvbytes" \
  --num-gpu-blocks-override "$nblocks" --enable-prompt-tokens-details --enable-per-request-metrics \
  --disable-uvicorn-access-log --enable-log-requests "$@" \
  >"$log" 2>&1 < /dev/null &
echo $!
