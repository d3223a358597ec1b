"""Write a Mooncake-format block-id trace of requests reading shared documents (for live/sglang_check.sh):

    live/shared_docs_trace.py OUT.jsonl SEED N

Each request reads the first 2–12 blocks of one of 40 documents (Zipf-like popularity, exponent 0.9) and appends
0–3 blocks of its own; output 1–8 tokens. Not a chat: no request continues another, so the radix tree's shared
nodes are re-read by later requests long after they were created — where LRU, FIFO, T-LRU and the frequency
policies order leaves differently (on multi-turn chats a conversation's leaf is its newest node, and FIFO and
T-LRU evict as LRU). Same arguments, same trace.
"""

import json
import sys

import numpy as np


def main(out: str, seed: str, n: str) -> None:
    rng = np.random.default_rng(int(seed))
    docs = [list(range(1000 * d, 1000 * d + 12)) for d in range(40)]
    w = 1.0 / np.arange(1, 41) ** 0.9
    w /= w.sum()
    nxt = 10**6
    with open(out, "w") as f:
        for r in range(int(n)):
            d = int(rng.choice(40, p=w))
            k = int(rng.integers(2, 13))
            u = int(rng.integers(0, 4))
            ids = docs[d][:k] + list(range(nxt, nxt + u))
            nxt += u
            rec = {"timestamp": r * 100, "input_length": len(ids) * 512, "output_length": int(rng.integers(1, 9))}
            f.write(json.dumps(rec | {"hash_ids": ids}) + "\n")
    print(f"{out}: {int(n)} requests over 40 shared documents")


if __name__ == "__main__":
    main(*sys.argv[1:4])
