"""vLLM's real ``Scheduler`` with a KV connector (scheduler side), driven on CPU request by request.

Runs only inside the vLLM conformance environment (``conformance/make_env.sh vllm 0.33.0``); never imported by
kvhit. What is real: ``vllm.v1.core.sched.scheduler.Scheduler`` (admission, async loads through
``WAITING_FOR_REMOTE_KVS``, ``update_from_output``, the extra step that reports finished requests), its
``KVCacheManager`` / ``BlockPool``, the connector built by vLLM's own ``KVConnectorFactory`` from a
``KVTransferConfig`` (``OffloadingConnector`` with ``CPUOffloadingSpec`` → ``OffloadingConnectorScheduler`` +
``CPUOffloadingManager``; ``SimpleCPUOffloadConnector`` → ``SimpleCPUOffloadScheduler``), the real ``Request``
with the real block hasher (sha256). What stands in for the GPU worker: :meth:`RealScheduler.run` answers every
step with a ``ModelRunnerOutput`` that samples one token per scheduled request and reports every transfer job
of the step's connector metadata as completed (loads as ``finished_recving`` too) — a worker whose copies finish
within the step. The model config is a local one-layer Llama ``config.json`` (no weights, no tokenizer, no
network). Each request is a PD prefill (``max_tokens=1``); the engine loop steps while
``scheduler.has_requests()``, as ``EngineCore.step`` does, so the step that reports a finished request runs before
the next request arrives. ``max_num_batched_tokens`` is at least the longest prompt, so chunked prefill (on, as
vLLM requires when it is below ``max_model_len``) never splits a prompt.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # a refused store is a warning per request

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

VERSION = vllm.__version__
for _name in ("vllm", "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"):
    logging.getLogger(_name).setLevel(logging.ERROR)
LAYER = "model.layers.0.self_attn.attn"
_MODEL_DIR: str | None = None


def _model_dir() -> str:
    global _MODEL_DIR
    if _MODEL_DIR is None:
        d = tempfile.mkdtemp(prefix="kvhit-tiny-llama-")
        cfg = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "num_hidden_layers": 1,
            "vocab_size": 1_000_000,
            "max_position_embeddings": 1 << 16,
            "torch_dtype": "float32",
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        _MODEL_DIR = d
    return _MODEL_DIR


class RealScheduler:
    """vLLM's ``Scheduler`` over ``N`` usable GPU blocks with ``connector`` (``kv_connector_extra_config=extra``)."""

    def __init__(self, N: int, *, block_size: int, connector: str, extra: dict, max_num_batched_tokens: int):
        init_none_hash(sha256)
        b = block_size
        max_len = max(max_num_batched_tokens, (N + 1) * b) + 8
        model = ModelConfig(model=_model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=max_len)
        sched = SchedulerConfig(
            max_num_seqs=1,  # one request at a time
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_len,
            enable_chunked_prefill=True,  # never splits here: every prompt fits in max_num_batched_tokens
            is_encoder_decoder=False,
        )
        cache = CacheConfig(block_size=b, enable_prefix_caching=True)
        kvt = KVTransferConfig(kv_connector=connector, kv_role="kv_both", kv_connector_extra_config=extra)
        self.cfg = VllmConfig(
            model_config=model,
            scheduler_config=sched,
            cache_config=cache,
            kv_transfer_config=kvt,
            device_config=DeviceConfig("cpu"),
        )
        spec = FullAttentionSpec(block_size=b, num_kv_heads=1, head_size=1, dtype=torch.float32)
        page = spec.page_size_bytes
        self.bytes_per_block = page
        # one backing tensor (the connectors size their CPU pools from it): page bytes per block, one layer
        tensor = KVCacheTensor(size=page * (N + 1), layers=[LAYER], layer_stride=page * (N + 1), block_stride=page)
        kcc = KVCacheConfig(
            num_blocks=N + 1, kv_cache_tensors=[tensor], kv_cache_groups=[KVCacheGroupSpec([LAYER], spec)]
        )
        self.cfg.cache_config.num_gpu_blocks = N + 1
        self.s = Scheduler(
            vllm_config=self.cfg,
            kv_cache_config=kcc,
            structured_output_manager=StructuredOutputManager(self.cfg),
            block_size=b,
            log_stats=False,
        )
        self.b = b
        self.hasher = get_request_block_hasher(b, sha256)
        self.conn = self.s.connector
        self.id_of: dict[bytes, int] = {}
        self.seen: dict[str, list] = {}  # req id -> [g, c]
        conn = self.conn
        orig_match, orig_alloc = conn.get_num_new_matched_tokens, conn.update_state_after_alloc

        def match(request, num_computed_tokens, *a, **k):
            out = orig_match(request, num_computed_tokens, *a, **k)
            self.seen.setdefault(request.request_id, [num_computed_tokens, 0])[0] = num_computed_tokens
            return out

        def alloc(request, blocks, num_external_tokens, *a, **k):
            if num_external_tokens:
                self.seen.setdefault(request.request_id, [0, 0])[1] = num_external_tokens
            return orig_alloc(request, blocks, num_external_tokens, *a, **k)

        conn.get_num_new_matched_tokens = match
        conn.update_state_after_alloc = alloc
        self.steps = 0

    # ---- the worker stand-in ------------------------------------------------------------------------
    def _worker_output(self, so) -> KVConnectorOutput | None:
        meta = so.kv_connector_metadata
        name = type(meta).__name__
        if name == "OffloadingConnectorMetadata":
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata

            done = OffloadingWorkerMetadata()
            recv = set()
            for jid, job in meta.load_jobs.items():
                done.mark_completed(jid)
                if not job.sync:
                    recv.add(job.req_id)
            for jid in meta.store_jobs:
                done.mark_completed(jid)
            return KVConnectorOutput(finished_recving=recv or None, kv_connector_worker_meta=done)
        if name == "SimpleCPUOffloadMetadata":
            from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

            recv = set(meta.load_event_to_reqs.get(meta.load_event, ())) if meta.load_event >= 0 else set()
            wm = (
                SimpleCPUOffloadWorkerMetadata(completed_store_events={meta.store_event: 1})
                if meta.store_event >= 0
                else None
            )
            return KVConnectorOutput(finished_recving=recv or None, kv_connector_worker_meta=wm)
        raise TypeError(f"unknown connector metadata {name}")

    def _step(self) -> None:
        so = self.s.schedule()
        ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids],
            kv_connector_output=self._worker_output(so),
        )
        self.s.update_from_output(so, out)
        self.steps += 1

    def run(self, rid: int, tokens, kvhit_hashes) -> tuple[int, int]:
        """Admit one PD request, step the engine until it is idle; returns (GPU hit, CPU hit) tokens."""
        vr = VRequest(
            request_id=f"r{rid}",
            prompt_token_ids=list(tokens),
            sampling_params=SamplingParams(max_tokens=1),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        for h, k in zip(vr.block_hashes, kvhit_hashes, strict=False):
            self.id_of[bytes(h)] = int(k)
        self.s.add_request(vr)
        n = 0
        while self.s.has_requests():
            self._step()
            n += 1
            if n > 50:
                raise RuntimeError("the scheduler did not go idle")
        g, c = self.seen.pop(vr.request_id)
        return int(g), int(c)

    # ---- inspection -----------------------------------------------------------------------------------
    def key(self, block_hash: bytes) -> int | str:
        """kvhit's id of a vLLM block hash (``"?"``: a hash no request prompt produced)."""
        return self.id_of.get(bytes(block_hash), "?")

    def key_grouped(self, h) -> int | str:
        """kvhit's id of a block's ``BlockHashWithGroupId``."""
        return self.key(get_block_hash(h))

    def gpu_order(self) -> list:
        pool = self.s.kv_cache_manager.block_pool
        return [
            self.id_of.get(bytes(get_block_hash(b.block_hash)), "?")
            for b in pool.free_block_queue.get_all_free_blocks()
            if b.block_hash is not None
        ]
