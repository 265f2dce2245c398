"""Profile reproducibility of the host-bound curves: the CPU expert and CPU dispatch curves measured
several times in a row, each repeat between two host probes (``profiler.host_probe``).

    python bench/bench_profile_repro.py --model mini --threads 16 8 --repeats 3 --out repro.json
    python bench/bench_profile_repro.py --model mini --cpu-engine kt --threads 14 --repeats 3

Per thread count it prints every repeat (CPU expert seconds at a few token counts, the fixed cost of a
call, dispatch at 1 and 16 tokens, the plain reference FFN and memory bandwidth before the repeat, the
CPU time stolen by the hypervisor during it) and the largest relative difference between any two
repeats, per curve: the issue's target is 5%. If the reference probes move as much as the curves, the
host moved, not the measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import numpy as np
import torch

from dllm_offload_sim.profiler.host_probe import StealMeter, host_probe
from dllm_offload_sim.profiler.measure import (
    Grids,
    cpu_engine_max_tokens,
    measure_cpu_dispatch,
    measure_cpu_expert,
)
from dllm_offload_sim.runtime.cpu_engine import ENGINES, make_cpu_engine
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.traces.cli import HelpFormatter

SHOW_TOKENS = (1, 8, 64, 1024)  # token counts printed per repeat


def max_pairwise(curves: list) -> float:
    """Largest |a - b| / min(a, b) over every pair of curves and every point."""
    worst = 0.0
    for a, b in itertools.combinations(curves, 2):
        x, y = np.asarray(a, float), np.asarray(b, float)
        worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.minimum(x, y), 1e-12))))
    return worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_profile_repro.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--model", default="mini", help="mini or flash (default mini)")
    p.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[torch.get_num_threads()],
        help="thread counts of the CPU engine to try (default torch's intra-op threads)",
    )
    p.add_argument(
        "--cpu-engine",
        default="auto",
        choices=ENGINES,
        help="CPU expert engine (default auto: kt where installed)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="the profiler's quick grid (smoke runs)")
    p.add_argument("--out", default=None, help="write every repeat as JSON here")
    args = p.parse_args(argv)
    if args.repeats < 2:
        print(f"error: --repeats must be >= 2 to compare repeats, got {args.repeats}", file=sys.stderr)
        return 2
    if min(args.threads) < 1:
        print(f"error: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    try:
        topo = topology_preset(args.model)
    except Exception as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    gr = Grids(args.quick)
    host = HostExperts(topo, n_real_layers=1, pin=cuda)
    show = [gr.tokens.index(t) for t in SHOW_TOKENS if t in gr.tokens]
    runs = []
    for threads in args.threads:
        engine = make_cpu_engine(
            args.cpu_engine,
            host,
            dev,
            threads=threads,
            max_tokens=cpu_engine_max_tokens(gr.tokens, gr.cpu_bands),
        )
        print(
            f"{topo.name}, {engine.name} CPU engine with {threads} threads, {args.repeats} repeats "
            f"(us; CPU expert at tokens {[gr.tokens[i] for i in show]})"
        )
        for r in range(args.repeats):
            probe = host_probe(host)
            steal = StealMeter()
            t0 = time.perf_counter()
            disp = measure_cpu_dispatch(topo, dev, gr)
            curve = measure_cpu_expert(topo, engine, gr, dispatch=disp)
            cpu_s, overhead = curve.per_expert_s, curve.call_overhead_s
            run = {
                "engine": engine.name,
                "threads": threads,
                "repeat": r,
                "probe": probe,
                "steal_frac": steal.fraction(),
                "wall_s": time.perf_counter() - t0,
                "tokens": gr.tokens,
                "cpu_expert_s": cpu_s,
                "call_overhead_s": overhead,
                "cpu_dispatch_s": disp,
            }
            runs.append(run)
            st = run["steal_frac"]
            print(
                f"  #{r}: cpu {[round(1e6 * cpu_s[i]) for i in show]} overhead {1e6 * overhead:.0f} "
                f"dispatch {1e6 * disp[0]:.0f}/{1e6 * disp[min(4, len(disp) - 1)]:.0f}  ref FFN "
                f"{probe['ref_expert_1tok_us']:.0f}/{probe['ref_expert_8tok_us']:.0f} mem {probe['mem_gbps']:.1f} GB/s "
                f"load {probe['loadavg_1m']} steal {'n/a' if st is None else f'{100 * st:.2f}%'} "
                f"({run['wall_s']:.0f} s)",
                flush=True,
            )
        engine.close()
        mine = [x for x in runs if x["threads"] == threads]
        print(
            f"  max difference between repeats: cpu_expert {100 * max_pairwise([x['cpu_expert_s'] for x in mine]):.1f}%"
            f", call overhead {100 * max_pairwise([[x['call_overhead_s']] for x in mine]):.1f}%"
            f", cpu_dispatch {100 * max_pairwise([x['cpu_dispatch_s'] for x in mine]):.1f}%"
            f", reference FFN {100 * max_pairwise([[x['probe']['ref_expert_1tok_us']] for x in mine]):.1f}%"
            f", memory bandwidth {100 * max_pairwise([[x['probe']['mem_gbps']] for x in mine]):.1f}%  [target 5%]"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": topo.name, "runs": runs}, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
