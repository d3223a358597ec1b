"""Re-check, against a running vLLM server, the facts kvhit's replay check rests on:
    live/facts.py URL OUT.json     (exit 1 when a fact does not hold)

1. ``vllm:cache_config_info`` reports ``block_size`` and ``num_gpu_blocks`` (= --num-gpu-blocks-override);
2. ``usage.prompt_tokens_details.cached_tokens`` of each response sums to the change of
   ``vllm:prefix_cache_hits_total``; the prompt tokens sum to ``vllm:prefix_cache_queries_total``'s change;
3. a prompt of exactly 2 blocks sent twice hits 1 block (the hit is capped at T − 1 tokens);
4. a request of T prompt and m generated tokens leaves the KV of T + m − 1 tokens: the next turn hits the
   block that ends at T + m − 1, not the one that would end at T + m;
5. block 0 is vLLM's null block: with num_gpu_blocks = G, only G − 1 blocks hold KV — after a request of 2 full
   blocks, fresh requests taking G − 3 more full blocks evict exactly one of its blocks (its last); with G usable
   blocks they would evict none.
"""

import json
import random
import sys

import httpx

from kvhit.replay.client import CACHE_INFO, HITS, QUERIES, parse_metrics


def main(url: str, out: str) -> int:
    c = httpx.Client(base_url=url, timeout=120)
    rnd = random.Random(20261202)

    def metrics():
        return parse_metrics(c.get("/metrics").text)

    def counter(m, name):
        return sum(v for _lab, v in m[name])

    def comp(prompt, n=1):
        body = dict(
            model="tiny",
            prompt=prompt,
            max_tokens=n,
            min_tokens=n,
            ignore_eos=True,
            temperature=0,
            return_token_ids=True,
        )
        r = c.post("/v1/completions", json=body)
        r.raise_for_status()
        d = r.json()
        sent.append(len(prompt))
        got.append(d["usage"]["prompt_tokens_details"]["cached_tokens"])
        return d["usage"]["prompt_tokens_details"]["cached_tokens"], d["choices"][0]["token_ids"]

    def fresh(n):
        return [rnd.randrange(1000, 32000) for _ in range(n)]

    sent: list[int] = []
    got: list[int] = []
    m0 = metrics()
    info = m0[CACHE_INFO][0][0]
    b, G = int(info["block_size"]), int(info["num_gpu_blocks"])
    if c.post("/reset_prefix_cache").status_code != 200:
        print("facts: POST /reset_prefix_cache failed (VLLM_SERVER_DEV_MODE=1?)", file=sys.stderr)
        return 1
    facts = {"block_size": b, "num_gpu_blocks": G, "enable_prefix_caching": info.get("enable_prefix_caching")}
    # 3: T - 1 cap
    p = fresh(2 * b)
    comp(p)
    facts["exact_2_blocks_repeat_hit"] = comp(p)[0]
    facts["exact_2_blocks_repeat_expected"] = b
    # 4: m - 1 generated tokens cached (T + m - 1 = 3b - 1 vs 3b, then T + m - 1 = 3b)
    m = 10
    p = fresh(3 * b - m)
    _, o = comp(p, m)
    facts["next_turn_hit_T_plus_m_eq_3b"] = comp(p + o + fresh(5), 2)[0]
    facts["next_turn_hit_T_plus_m_eq_3b_expected_if_m_minus_1"] = 2 * b
    p = fresh(3 * b - m + 1)
    _, o = comp(p, m)
    facts["next_turn_hit_T_plus_m_minus_1_eq_3b"] = comp(p + o + fresh(5), 2)[0]
    facts["next_turn_hit_T_plus_m_minus_1_eq_3b_expected"] = 3 * b
    # 5: null block. After a reset, A (H = 2 full blocks + 1 partial) is cached; fillers of fresh content then
    # take Σ f = G − 3 full blocks (+ 1 partial each, returned to the free-queue head): the last filler needs one
    # block more than is free when only G − 1 blocks hold KV, and evicts A's last block (tail first)
    c.post("/reset_prefix_cache")
    H = 2
    a = fresh(H * b + 5)
    comp(a)
    left = G - 3
    max_len = int(c.get("/v1/models").json()["data"][0]["max_model_len"])
    fmax = max_len // b - 2
    while left > 0:
        f = min(fmax, left)
        comp(fresh(f * b + 5))
        left -= f
    facts["null_block_first_request_rehit"] = comp(a)[0]
    facts["null_block_expected_if_G_minus_1_usable"] = (H - 1) * b
    facts["null_block_expected_if_G_usable"] = H * b
    m1 = metrics()
    facts["queries_delta"] = counter(m1, QUERIES) - counter(m0, QUERIES)
    facts["hits_delta"] = counter(m1, HITS) - counter(m0, HITS)
    facts["sum_prompt_tokens"] = sum(sent)
    facts["sum_cached_tokens"] = sum(got)
    checks = {
        "cache_config_info reports num_gpu_blocks": G > 1,
        "hits counter = sum of cached_tokens": facts["hits_delta"] == facts["sum_cached_tokens"],
        "queries counter = sum of prompt tokens": facts["queries_delta"] == facts["sum_prompt_tokens"],
        "hit capped at T - 1 tokens": facts["exact_2_blocks_repeat_hit"] == b,
        "m - 1 generated tokens cached (not m)": facts["next_turn_hit_T_plus_m_eq_3b"] == 2 * b
        and facts["next_turn_hit_T_plus_m_minus_1_eq_3b"] == 3 * b,
        "block 0 is the null block (G - 1 usable)": facts["null_block_first_request_rehit"] == (H - 1) * b,
    }
    facts["checks"] = checks
    with open(out, "w") as fh:
        json.dump(facts, fh, indent=1)
    bad = [k for k, v in checks.items() if not v]
    for k, v in checks.items():
        print(f"facts (block {b}, {G} blocks): {'holds' if v else 'DOES NOT HOLD'}: {k}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
