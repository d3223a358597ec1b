#!/usr/bin/env bash
# make conformance: kvhit's engine models against the engines' own cache code (see conformance/README.md).
# Every line of the table is one command of conformance/check_vllm.py; summaries go to $OUT/results.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${KVHIT_CONFORMANCE_OUT:-out/conformance}
CASES=${KVHIT_CONFORMANCE_CASES:-1000}
mkdir -p "$OUT"; : > "$OUT/results.jsonl"
export PYTHONPATH=$PWD/src NUMBA_CACHE_DIR=${KVHIT_CONFORMANCE_CACHE:-$HOME/.cache/kvhit-conformance}/numba
status=0
check() {  # python model args...
  local py=$1; shift
  "$py" conformance/check_vllm.py --json "$OUT/results.jsonl" "$@" 2>&1 | grep -v " INFO \|^INFO" || status=1
}
# vLLM <= 0.23 free-queue order and the newest release (pinned; bump VLLM_NEWEST to track a new one)
VLLM_OLD=${VLLM_OLD:-0.23.0}
VLLM_NEWEST=${VLLM_NEWEST:-0.33.0}
py_old=$(conformance/make_env.sh vllm "$VLLM_OLD")
py_new=$(conformance/make_env.sh vllm "$VLLM_NEWEST")
check "$py_old" --model vllm-0.23 --cases "$CASES" --seed 0
check "$py_new" --model vllm --cases "$CASES" --seed 0
# negative controls: each must find a mismatch
check "$py_old" --model vllm --cases 300 --seed 1 --expect-mismatch
check "$py_old" --model vllm --compare hits --cases 300 --seed 1 --expect-mismatch
check "$py_old" --model no-hit-cap:vllm-0.23 --cases 300 --seed 1 --expect-mismatch
check "$py_new" --model vllm-0.23 --cases 300 --seed 1 --expect-mismatch
check "$py_new" --model vllm-0.23 --compare hits --cases 300 --seed 1 --expect-mismatch
check "$py_new" --model no-hit-cap:vllm --cases 300 --seed 1 --expect-mismatch
# host tier (issue 16): the native CPU-offloading tier's manager against vLLM's CPUOffloadingManager
tiers() { "$py_new" conformance/check_tiers_native.py --json "$OUT/results.jsonl" "$@" 2>&1 | grep -v " INFO \|^INFO" || status=1; }
tiers --cases "$CASES" --seed 0
tiers --cases 300 --seed 1 --expect-mismatch
# host tiers through vLLM's real Scheduler + connector (scheduler side), PD requests one at a time
SCHED_CASES=${KVHIT_SCHED_CASES:-300}
sched() { "$py_new" conformance/check_tiers_scheduler.py --json "$OUT/results.jsonl" "$@" 2>&1 | grep -v " INFO \|^INFO\|Initializing KVConnectorBase\|vllm._C" || status=1; }
for t in native simple simple-lazy; do sched --tier "$t" --cases "$SCHED_CASES" --seed 0; done
sched --tier native --model reoffer-after-load --cases 100 --seed 1 --expect-mismatch
sched --tier simple-lazy --model no-finish-walk --cases 100 --seed 1 --expect-mismatch
sched --tier simple --model no-null-block --cases 100 --seed 1 --expect-mismatch
# SGLang (issue 12): engine="sglang" against SGLang's own RadixCache + TokenToKVPoolAllocator (page_size 1)
SGLANG=${SGLANG:-0.5.23}
py_sgl=$(conformance/make_env.sh sglang "$SGLANG")
sgl() { "$py_sgl" -W ignore conformance/check_sglang.py --json "$OUT/results.jsonl" "$@" 2>&1 | grep -v "Warning\|warnings.warn" || status=1; }
sgl --model sglang --cases "$CASES" --seed 0
sgl --model no-hit-cap --cases 300 --seed 1 --expect-mismatch
# the other eviction policies (RadixCache), and UnifiedRadixCache (full attention, no HiCache) with both tree cores
sgl --evict-policy fifo --cases "$CASES" --seed 0  # mru, filo: 0 / 1,000 too, outside make conformance (README)
sgl --model lru-always --evict-policy fifo --cases 300 --seed 1 --expect-mismatch
for core in rust python; do sgl --cache "unified-$core" --cases "$CASES" --seed 0; done
sgl --cache unified-rust --model no-hit-cap --cases 300 --seed 1 --expect-mismatch
# UnifiedRadixCache with FIFO/FILO (a split keeps the creation time: kvhit's default cache="unified"); the RadixCache
# model against it must mismatch
NEW=${KVHIT_CONFORMANCE_NEW_CASES:-300}
for pol in fifo filo; do sgl --cache unified-rust --evict-policy "$pol" --cases "$NEW" --seed 0; done
sgl --cache unified-python --evict-policy fifo --cases "$NEW" --seed 0
sgl --cache unified-rust --model other-cache --evict-policy fifo --cases 1000 --seed 1 --expect-mismatch
# the policies of --radix-eviction-policy beyond LRU: lfu, slru, priority (requests at priority 0), tlru (threshold 8)
for pol in lfu slru priority; do
  sgl --cache unified-rust --evict-policy "$pol" --cases "$NEW" --seed 0
  sgl --cache radix --evict-policy "$pol" --cases "$NEW" --seed 0
  sgl --cache unified-rust --model lru-always --evict-policy "$pol" --cases "$NEW" --seed 1 --expect-mismatch
done
sgl --cache unified-rust --evict-policy tlru --tlru-threshold 8 --cases "$NEW" --seed 0
sgl --cache unified-python --evict-policy tlru --tlru-threshold 8 --cases "$NEW" --seed 0
sgl --cache unified-rust --model lru-always --evict-policy tlru --tlru-threshold 8 --cases "$NEW" --seed 1 --expect-mismatch
"$py_sgl" -W ignore conformance/pinned_sglang.py 2>&1 | grep -v "Warning\|warnings.warn" || status=1
# SGLang HiCache (issue 12 §2): the HiCache tier model against SGLang's UnifiedRadixCache + HybridCacheController
hic() { "$py_sgl" -W ignore conformance/check_hicache.py --json "$OUT/results.jsonl" "$@" 2>&1 | grep -v "Warning\|warnings.warn" || status=1; }
for pol in write_through write_through_selective write_back; do hic --policy "$pol" --cases "$CASES" --seed 0; done
hic --policy write_through --tree-core python --cases "$CASES" --seed 0
hic --model threshold-1 --cases 300 --seed 1 --expect-mismatch
hic --model through-as-selective --cases 300 --seed 1 --expect-mismatch
exit $status
