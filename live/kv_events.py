"""vLLM's KV-cache events as a diagnostic of where kvhit's scheduler model departs from the engine (docs/live.md):

    # 1. in the server environment: bind the endpoint the server will connect to, keep every event batch
    live/kv_events.py record tcp://127.0.0.1:P EVENTS.bin        # run before the replay, stop by its PID after
    #    (or EVENTS.jsonl: decoded as they arrive, for `kvhit replay --kv-events EVENTS.jsonl`: the step clock)
    #    the server: live/serve.sh … --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
    #                "endpoint": "tcp://127.0.0.1:P", "topic": "kv"}'   (vLLM connects to a tcp://host:port endpoint)
    # 2. in the server environment: decode (vLLM's own msgspec classes) to JSON lines
    live/kv_events.py decode EVENTS.bin EVENTS.jsonl
    # 3. in kvhit's environment: for each request whose simulated hit (the log's scheduler column) differs from the
    #    server's cached_tokens, the engine's store/remove history of its prompt blocks, relative to its
    #    "Added request" time (the log must come from `kvhit replay --server-log`)
    live/kv_events.py explain LOG.parquet EVENTS.jsonl
    # 4. in kvhit's environment: every request's hit looked up in the engine's own cache state (the events up to
    #    its admission), against cached_tokens and kvhit's model: what is left to the lookup rule vs the timing
    live/kv_events.py oracle LOG.parquet EVENTS.jsonl

The engine publishes one batch per step, stamped with time.time() at the step's end
(vllm/v1/core/sched/scheduler.py update_from_output: KVEventBatch(ts=time.time())): the same wall clock as the
server log's "Added request" lines. Blocks are matched by their token prefix (BlockStored carries the token ids
and the parent hash), so no knowledge of vLLM's hash function is needed.
"""

import hashlib
import json
import struct
import sys


def record(endpoint, out):  # noqa: D103
    """Keep every batch: raw (length-prefixed msgpack) or, for an ``.jsonl`` path, decoded as it arrives (what
    ``kvhit replay --kv-events`` and ``live/recheck.py --kv-events`` read; needs vLLM's classes: server env)."""
    import zmq

    sock = zmq.Context().socket(zmq.SUB)
    sock.bind(endpoint)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    as_json = str(out).endswith(".jsonl")
    line = _decoder() if as_json else None
    with open(out, "a" if as_json else "ab") as f:
        while True:
            payload = sock.recv_multipart()[-1]
            f.write(line(payload) if as_json else struct.pack("<I", len(payload)) + payload)
            f.flush()


def _decoder():
    import msgspec
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    dec = msgspec.msgpack.Decoder(type=KVEventBatch)

    def h(x):
        return x.hex() if isinstance(x, bytes) else x

    def line(payload):
        b = dec.decode(payload)
        ev = []
        for e in b.events:
            if isinstance(e, BlockStored):
                ev.append(["S", [h(x) for x in e.block_hashes], h(e.parent_block_hash), list(e.token_ids)])
            elif isinstance(e, BlockRemoved):
                ev.append(["R", [h(x) for x in e.block_hashes]])
            else:
                ev.append(["C"])
        return json.dumps({"ts": b.ts, "ev": ev}) + "\n"

    return line


def decode(src, out):  # noqa: D103
    line = _decoder()
    with open(src, "rb") as f, open(out, "w") as w:
        while len(n := f.read(4)) == 4:
            w.write(line(f.read(struct.unpack("<I", n)[0])))


def _key(base, toks):
    import numpy as np

    return hashlib.sha1(base + np.asarray(toks, np.int64).tobytes()).digest()


def explain(log, events_jsonl):  # noqa: D103
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(log)
    meta = json.loads(t.schema.metadata[b"kvhit_replay"])
    b = int(meta["server"]["block_size"])
    d = t.to_pydict()
    if "server_added_unix" not in d or "simulated_hit_tokens_scheduler" not in d:
        sys.exit(f"kv_events: {log} has no server anchors or scheduler column (replay with --check --server-log)")
    batches = [json.loads(line) for line in open(events_jsonl)]
    hist = {}
    for e, evs in zip(batches, _replay_events(batches, b), strict=True):
        for kind, base in evs:
            if kind != "C":
                hist.setdefault(base, []).append((e["ts"], "stored" if kind == "S" else "removed"))
    added = np.asarray(d["server_added_unix"], np.float64)
    for r, (meas, sim) in enumerate(zip(d["cached_tokens"], d["simulated_hit_tokens_scheduler"], strict=True)):
        if d["status"][r] != "ok" or meas == sim:
            continue
        p = d["prompt_ids"][r]
        print(f"request {r}: server {meas // b} blocks, model {sim // b} (prompt {len(p)} tokens)")
        base = b""
        lo, hi = sorted((meas // b, sim // b))
        for i in range(hi + (1 if hi == lo else 0)):
            base = _key(base, p[i * b : (i + 1) * b])
            if i < lo:
                continue
            last = [(round((ts - added[r]) * 1e3), what) for ts, what in hist.get(base, []) if ts <= added[r] + 1.0]
            print(f"  block {i}: last events (ms after 'Added request'): {last[-3:]}")


def _replay_events(batches, b):
    """Per batch, its events in order as (kind, prefix key): 'S' stored, 'R' removed, 'C' all cleared."""
    prefix, evs = {}, []
    for e in batches:
        out = []
        for ev in e["ev"]:
            if ev[0] == "S":
                base = prefix.get(ev[2], b"") if ev[2] is not None else b""
                for i, h in enumerate(ev[1]):
                    base = _key(base, ev[3][i * b : (i + 1) * b])
                    prefix[h] = base
                    out.append(("S", base))
            elif ev[0] == "R":
                out.extend(("R", prefix[h]) for h in ev[1] if h in prefix)
            else:
                out.append(("C", None))
        evs.append(out)
    return evs


def oracle(log, events_jsonl):  # noqa: D103
    """Each request's hit looked up (chained blocks, capped at (T − 1) // b) in the engine's OWN cache state: every
    event before the request's admission — the step batch that stores its first uncached block (its measured hit),
    taken up to that store (a batch lists a step's events in execution order: running requests first, then the
    admissions in order); for a request that stores no block there, every batch that ended before its 'Added
    request' time + queue time. Where this matches cached_tokens and kvhit's model does not, the model's cache
    state at that moment differed (which steps ran when), not its lookup rule."""
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(log)
    b = int(json.loads(t.schema.metadata[b"kvhit_replay"])["server"]["block_size"])
    d = t.to_pydict()
    if "server_added_unix" not in d or "simulated_hit_tokens_scheduler" not in d:
        sys.exit(f"kv_events: {log} has no server anchors or scheduler column (replay with --check --server-log)")
    batches = [json.loads(line) for line in open(events_jsonl)]
    ts = np.array([e["ts"] for e in batches])
    evs = _replay_events(batches, b)
    added = np.asarray(d["server_added_unix"], np.float64)
    queue = np.asarray(d["server_queue_ms"], np.float64) / 1e3
    n_or = n_mod = n_ok = by_time = 0
    for r in range(len(d["status"])):
        if d["status"][r] != "ok":
            continue
        n_ok += 1
        p = d["prompt_ids"][r]
        base, ks = b"", []
        for i in range(len(p) // b):
            base = _key(base, p[i * b : (i + 1) * b])
            ks.append(base)
        meas, sim = d["cached_tokens"][r] // b, d["simulated_hit_tokens_scheduler"][r] // b
        adm = None
        if meas < len(ks):
            for j in np.flatnonzero(ts >= added[r] - 0.005):
                if ("S", ks[meas]) in evs[j]:
                    adm = int(j)
                    break
        upto = []
        if adm is None:
            adm = int(np.searchsorted(ts, added[r] + queue[r]))
            by_time += 1
        else:
            upto = evs[adm][: evs[adm].index(("S", ks[meas]))]
        live = set()
        for kind, k in [x for j in range(adm) for x in evs[j]] + upto:
            if kind == "S":
                live.add(k)
            elif kind == "R":
                live.discard(k)
            else:
                live.clear()
        h = 0
        while h < (len(p) - 1) // b and ks[h] in live:
            h += 1
        n_or += h != meas
        n_mod += sim != meas
        if h != meas or sim != meas:
            print(f"request {r}: server {meas} blocks, engine-state lookup {h}, kvhit's model {sim}")
    print(
        f"{n_ok} requests ({by_time} cut by time): the lookup on the engine's own cache state differs from "
        f"cached_tokens on {n_or}, kvhit's scheduler model on {n_mod}"
    )


def main(argv):  # noqa: D103
    cmds = {"record": record, "decode": decode, "explain": explain, "oracle": oracle}
    if len(argv) != 3 or argv[0] not in cmds:
        sys.exit(__doc__)
    cmds[argv[0]](argv[1], argv[2])


if __name__ == "__main__":
    main(sys.argv[1:])
