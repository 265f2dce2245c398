"""The TPOT bound's cost (sim/bound.py) and where it stands, on the default trace.

    python bench/bench_bound.py                 # seconds per request of the bound, and the report table
    python bench/bench_bound.py --repeats 5 --caches 20,40,60,100

Target (the bound issue): <= 10 s per request at LLaDA2.0-mini shapes on one core. The report: at each cache, the
bound, the best clairvoyant schedule the engine runs (belady, belady_shared, clairvoyant_coop, clairvoyant_model),
OLED and Naive-LRU.
"""

from __future__ import annotations

import argparse
import time

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.sim.bound import tpot_bound
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import default_trace_path
from dllm_offload_sim.wiring.build import make_policy, policy_config
from dllm_offload_sim.traces.cli import HelpFormatter

CLAIRVOYANT = ("belady", "belady_shared", "clairvoyant_coop", "clairvoyant_model")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_bound.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed repeats of the bound per cache (min/median/max)"
    )
    p.add_argument("--caches", default="20,40,60,100", help="comma-separated caches")
    p.add_argument("--profile", default="h100-mini", help="shipped profile name or file")
    args = p.parse_args(argv)
    trace, cost = Trace.open(default_trace_path()), CostModel(args.profile)
    n_req = len(trace.request_ids)
    tpot_bound(trace, 40, cost, requests=trace.request_ids[:1])  # compile the kernels once, untimed
    print(f"trace {trace.path.name} ({n_req} requests), profile {cost.profile.name}, one process")
    print(
        "| Cache | bound ms | s per request (min / median / max) | window | best clairvoyant schedule ms | OLED ms | "
        "Naive-LRU ms | best schedule / bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in [int(x) for x in args.caches.split(",")]:
        times = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            b = tpot_bound(trace, c, cost, dummy_warmup=True)
            times.append((time.process_time() - t0) / n_req)
        times.sort()
        runs = {
            n: simulate(trace, make_policy(policy_config(n)), c, cost, dummy_warmup=True).summary["tpot_ms"]
            for n in (*CLAIRVOYANT, "oled", "naive_lru")
        }
        best = min(CLAIRVOYANT, key=runs.get)
        print(
            f"| {c} | {b.tpot_ms:.2f} | {times[0]:.3f} / {times[len(times) // 2]:.3f} / {times[-1]:.3f} | "
            f"{b.window} | {best} {runs[best]:.2f} | {runs['oled']:.2f} | {runs['naive_lru']:.2f} | "
            f"{runs[best] / b.tpot_ms:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
