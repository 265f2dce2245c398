"""Your own trace, from its characterisation to a simulation: here a generated one, or a collected one.

    python examples/own_trace.py --out traces_out/example       # generate, characterise, simulate
    python examples/own_trace.py --trace traces_out/mine        # a trace you collected (dllm-trace-collect)

The commands behind it: dllm-synth, dllm-stats, dllm-sim trace.path=DIR.
"""

from __future__ import annotations

import argparse

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.policies.oled import OLEDPolicy
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.analytics import compute_stats
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace
from dllm_offload_sim.wiring.build import shape_of


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="generate a small synthetic trace here (a new directory)")
    g.add_argument("--trace", help="an existing trace directory")
    a = p.parse_args(argv)
    path = a.trace or write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=64, seed=0), a.out)
    trace = Trace.open(path)  # every table validated on open
    stats = compute_stats(trace).summary
    print(
        f"{path}: {len(trace)} requests, {trace.topology.name}; adjacent-iteration overlap "
        f"{stats['adjacent_overlap']:.3f}, tokens per forward {stats['tokens_per_forward']:.2f}"
    )
    cost = CostModel(f"h200-{shape_of(trace)}")
    for policy in (NaiveLRUPolicy(), OLEDPolicy()):
        s = simulate(trace, policy, 40, cost, dummy_warmup=True).summary
        print(f"{s['policy']:10s} Cache 40: TPOT {s['tpot_ms']:.2f} ms, hit rate {s['hit_rate']:.3f}")


if __name__ == "__main__":
    main()
