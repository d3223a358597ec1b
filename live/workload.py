"""Write the chat traces `make live` replays (kvhit Parquet, token counts), one per argument:
    live/workload.py OUT.parquet:SEED:N_CONV[:MEAN_USER:MAX_RESP:LAM0:W_MEAN:MEAN_TURNS] ...

Conversations as in kvhit's generator (Poisson arrivals λ0, geometric turns, exponential think times W), each turn
adding a user message of 1 + Geometric(mean_user) tokens, the previous answer of 1..max_resp tokens (uniform) in
between; prompts are capped so that prompt + answer stay below 4,096 tokens (the server's --max-model-len) with a
shared system prompt of up to 256 tokens. Same arguments, same trace.
"""

import sys

import numpy as np

from kvhit.workload import Exponential, Geometric, Trace
from kvhit.workload.generate import trace_from_conversations

CAP = 4096 - 256 - 64


def one(out, seed, n_conv, mean_user=60.0, max_resp=40.0, lam0=1.0, w_mean=8.0, mean_turns=8.0):
    seed, n_conv = int(seed), int(n_conv)
    rng = np.random.default_rng(seed)
    M = Geometric.from_mean(mean_turns).sample(rng, n_conv).astype(np.int64)
    rows_T, rows_resp, keepM = [], [], []
    for m in M:
        T, Ts, rs = 0, [], []
        prev_resp = 0
        for _j in range(int(m)):
            u = int(rng.geometric(1.0 / mean_user))
            r = int(rng.integers(1, int(max_resp) + 1))
            nt = T + prev_resp + u
            if nt + r > CAP:
                break
            T = nt
            Ts.append(T)
            rs.append(r)
            prev_resp = r
        if not Ts:
            Ts, rs = [int(rng.integers(1, 200))], [int(rng.integers(1, int(max_resp) + 1))]
        rows_T += Ts
        rows_resp += rs
        keepM.append(len(Ts))
    M = np.array(keepM, np.int64)
    T = np.array(rows_T, np.int64)
    b = 16
    R = -(-T // b)
    starts = np.cumsum(M) - M
    prevR = np.concatenate([[0], R[:-1]])
    first = np.zeros(T.size, bool)
    first[starts] = True
    Z = np.where(first, R, np.maximum(R - prevR, 1))
    tr = trace_from_conversations(
        M,
        Z,
        lam0=lam0,
        interarrival=Exponential(w_mean),
        seed=seed,
        extra={"cum_tokens": T, "response_tokens": np.array(rows_resp, np.int64)},
        meta={"block_size": b, "source": "live/workload.py"},
    )
    assert isinstance(tr, Trace)
    tr.write(out)
    print(f"{out}: {tr.n_turns} requests, {tr.n_conversations} conversations, max prompt {int(T.max())} tokens")


def main(argv):
    for a in argv:
        out, *rest = a.split(":")
        one(out, *(float(x) for x in rest))


if __name__ == "__main__":
    main(sys.argv[1:])
