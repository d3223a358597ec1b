"""Where the agentic expected value's miss on held-out WEKA pools comes from (issue 23 §2, docs/estimators.md §4.1).

For each pool (``agentic_accuracy.band_pools``) and start law (uniform on [0, 3600] s; Poisson at C/3600 per s with
the k-th arrival going to conversation k in every seed — the benchmark's ``poisson``), ``R`` realisations of the
law are simulated exactly; their mean ``E_R`` is a low-noise reference (standard error ``se_R``), and the first 16
form the benchmark's 16-seed mean. On each of the first 16 realisations: the estimator with the former ``√C``-bin
start histogram (``est_sqrt``) and with the Birgé–Rozenholc bin count (``est_br``), and the mean of ``K`` exact
replays at starts redrawn from the Birgé–Rozenholc histogram (``mc_br``). Printed: signed value, at the capacity
where it is largest in magnitude (feasible, 10–90 % of the ceiling), of mean-over-seeds differences; ``E_iid`` is the
uniform law's ``E_R`` (i.i.d. starts: the exchangeable law the estimator models).

    nice -n 10 python benchmarks/band_bias_diagnosis.py held-35a,held-35b 96 4
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from agentic_accuracy import band_pools, compose, grid, realisation_starts  # noqa: E402
from kvhit.estimate.agentic import estimate_trace  # noqa: E402
from kvhit.estimate.band import realisation_replays  # noqa: E402
from kvhit.estimate.startbins import start_bins  # noqa: E402
from kvhit.sim.vllm.curve import block_curve  # noqa: E402
from kvhit.workload.reuse import request_reuse  # noqa: E402


def _sim(pt, Ns, eng):
    rq = pt.to_block_requests()
    c = block_curve(
        rq.prompt_tokens, rq.hash_offsets, rq.hashes, block_size=rq.block_size, Ns=Ns, engine=eng, fallback="nan"
    )
    return c["token_hit_ratio"]


def main() -> None:
    pools, R, K = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    eng = sys.argv[4] if len(sys.argv) > 4 else "vllm"
    res = {}
    for name, _held, base, draws in band_pools(False):
        if name not in pools:
            continue
        C = draws.shape[0]
        t0 = time.perf_counter()
        laws = ("uniform", "poisson")
        tr = {a: [compose(base, draws, realisation_starts(a, C, s), {"seed": s}) for s in range(R)] for a in laws}
        Ns = grid(tr["uniform"][0], 80)
        ref = {a: np.array([_sim(pt, Ns, eng) for pt in tr[a]]) for a in laws}
        for a in laws:
            Esq, Ebr, Mbr, nb = [], [], [], []
            for s in range(16):
                pt = tr[a][s]
                u = request_reuse(pt)
                e = estimate_trace(u, Ns, engine=eng, bin_rule="sqrt")
                Esq.append(e.h)
                first = np.full(C, np.inf)
                np.minimum.at(first, pt.session, pt.time)
                b = start_bins(first)
                nb.append(b)
                Ebr.append(estimate_trace(u, Ns, engine=eng, bins=b).h)
                Mbr.append(realisation_replays(pt, Ns, engine=eng, replays=K, seed=1000 + s, bins=b).mean(0))
            E_all, sd, s16, E_iid = ref[a].mean(0), ref[a].std(0, ddof=1), ref[a][:16].mean(0), ref["uniform"].mean(0)
            mb = (Ns >= e.N_min) & (s16 >= 0.1 * e.h_max) & (s16 <= 0.9 * e.h_max) & np.isfinite(s16)

            def d(x, y, mb=mb):
                v = (x - y)[mb]
                return round(float(v[np.argmax(np.abs(v))]), 4)

            r = {
                "bins": sorted(set(nb)),
                "sd_h": round(float(sd[mb].max()), 4),
                "se_R": round(float(sd[mb].max() / np.sqrt(R)), 4),
                f"sim16_minus_E{R}": d(s16, E_all),
                "est_sqrt_minus_sim16": d(np.mean(Esq, 0), s16),
                "est_sqrt_minus_E": d(np.mean(Esq, 0), E_all),
                "est_br_minus_sim16": d(np.mean(Ebr, 0), s16),
                "est_br_minus_E": d(np.mean(Ebr, 0), E_all),
                "est_br_minus_Eiid": d(np.mean(Ebr, 0), E_iid),
                "mc_br_minus_sim16": d(np.mean(Mbr, 0), s16),
                "mc_br_minus_E": d(np.mean(Mbr, 0), E_all),
                "mc_br_minus_Eiid": d(np.mean(Mbr, 0), E_iid),
                "E_minus_Eiid": d(E_all, E_iid),
                "seed_est_br_minus_E": round(float(np.abs(np.array(Ebr) - E_all)[:, mb].max()), 4),
                "seed_mc_br_minus_E": round(float(np.abs(np.array(Mbr) - E_all)[:, mb].max()), 4),
                "seed_est_sqrt_minus_E": round(float(np.abs(np.array(Esq) - E_all)[:, mb].max()), 4),
                "elapsed": round(time.perf_counter() - t0),
            }
            res[f"{name}/{a}"] = r
            print(name, a, json.dumps(r), flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
