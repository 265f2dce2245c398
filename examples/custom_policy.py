"""A policy of your own, beside the shipped ones, in a few lines: FIFO retention per MoE layer.

    python examples/custom_policy.py                 # Naive-LRU vs FIFO on the shipped real trace, Cache 20/40
    python examples/custom_policy.py --requests 0    # one request only (quicker)

To use it from the command line instead, put the class in an importable module and write its config
(docs/policies.md, "Add a policy").
"""

from __future__ import annotations

import argparse
from collections import deque

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.policies.base import LayerDecision, LayerView, Policy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import resolve_trace


class FIFOPolicy(Policy):
    """First in, first out per MoE layer: every miss is copied; the oldest copy leaves first."""

    name = "fifo"

    def setup(self, ctx):
        super().setup(ctx)
        self.queue = [deque() for _ in range(ctx.n_layers)]

    def decide(self, view: LayerView) -> LayerDecision:
        q = deque(e for e in self.queue[view.layer] if e in view.resident)
        q.extend(view.missed.tolist())
        while len(q) > view.capacity:
            q.popleft()
        self.queue[view.layer] = q
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(q))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, nargs="*", default=None, help="request ids (default: all)")
    a = p.parse_args(argv)
    trace, cost = Trace.open(resolve_trace(None)), CostModel("h200-mini")
    print(f"{'policy':10s} {'cache':>5s} {'TPOT ms':>9s} {'hit rate':>8s}")
    for cache in (20, 40):
        for policy in (NaiveLRUPolicy(), FIFOPolicy()):
            s = simulate(trace, policy, cache, cost, requests=a.requests, dummy_warmup=True).summary
            print(f"{s['policy']:10s} {cache:5d} {s['tpot_ms']:9.2f} {s['hit_rate']:8.3f}")


if __name__ == "__main__":
    main()
