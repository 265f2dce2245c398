"""Simulator memory: the peak resident memory of one simulation as the trace grows (issue: sweeps at interactive
speed; target <= 600 MB for 64 requests x 4,096 tokens at flash shapes).

    python bench/bench_memory.py                                   # 64 x 4096 flash, naive_lru and oled
    python bench/bench_memory.py --requests 8 --tokens 1024        # a smaller trace
    python bench/bench_memory.py --trace /tmp/flash64 --keep       # keep the generated trace there and reuse it
    python bench/bench_memory.py --trace /tmp/flash64 --allocator both   # dllm-sim's allocator and glibc's default

Each simulation runs in a process of its own (its peak is its own), over the first 1, a quarter of and all the
trace's requests, so the line shows whether memory grows with the number of requests, with the allocator set as
``dllm-sim`` sets it (``sim.allocator``: large blocks mapped on their own) or, for comparison, glibc's default. Generating the 64-request
flash trace takes about 5 min on 2 cores; its simulations about 2 min each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(trace: str, policy: str, n: int, profile: str, cache: int, allocator: bool) -> None:
    import resource

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.sim.allocator import map_large_blocks
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    if allocator:
        map_large_blocks()  # as dllm-sim's runs do
    tr = Trace.open(trace)
    t0 = time.perf_counter()
    r = simulate(
        tr, make_policy(policy_config(policy, [])), cache, CostModel(profile), requests=tr.request_ids[:n]
    )
    print(
        json.dumps(
            {
                "policy": policy,
                "requests": n,
                "forwards": r.summary["forwards"],
                "wall_s": time.perf_counter() - t0,
                "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def main() -> None:
    from dllm_offload_sim.traces.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", default="flash", help="catalogue model of the generated trace")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=4096, help="new tokens per request")
    ap.add_argument("--policies", default="naive_lru,oled")
    ap.add_argument("--cache", type=int, default=40)
    ap.add_argument("--profile", default=None, help="cost profile (default h200-MODEL)")
    ap.add_argument("--trace", default=None, help="use this trace folder (made there with --keep if missing)")
    ap.add_argument("--keep", action="store_true", help="write the generated trace to --trace and keep it")
    ap.add_argument(
        "--allocator",
        choices=["dllm-sim", "default", "both"],
        default="dllm-sim",
        help="the process's allocator as dllm-sim sets it (sim.allocator), glibc's default, or both, interleaved",
    )
    ap.add_argument("--child", nargs=3, metavar=("TRACE", "POLICY", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    profile = a.profile or f"h200-{a.model}"
    if a.child:
        child(a.child[0], a.child[1], int(a.child[2]), profile, a.cache, a.allocator == "dllm-sim")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_recipes import machine  # a script beside this one

    with tempfile.TemporaryDirectory() as tmp:
        trace = a.trace or os.path.join(tmp, "trace")
        if not os.path.exists(os.path.join(trace, "meta.json")):
            if a.trace and not a.keep:
                ap.error(f"--trace {a.trace} has no meta.json; pass --keep to generate the trace there")
            t0 = time.perf_counter()
            subprocess.run(
                ["dllm-synth", "--model", a.model, "--n-requests", str(a.requests), "--max-new-tokens",
                 str(a.tokens), "--out", trace, "--quiet"],
                check=True,
            )  # fmt: skip
            print(
                f"generated {a.requests} x {a.tokens}-token {a.model} requests in {time.perf_counter() - t0:.0f} s"
            )
        print(f"machine: {machine()}")
        sizes = sorted({1, max(1, a.requests // 4), a.requests})
        allocators = ["dllm-sim", "default"] if a.allocator == "both" else [a.allocator]
        for policy in a.policies.split(","):
            for n in sizes:
                for alloc in allocators:
                    out = subprocess.run(
                        [sys.executable, __file__, "--model", a.model, "--profile", profile, "--cache", str(a.cache),
                         "--allocator", alloc, "--child", trace, policy, str(n)],
                        capture_output=True, text=True,
                    )  # fmt: skip
                    if out.returncode:
                        sys.exit(f"{policy}, {n} requests failed:\n{out.stderr[-3000:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    print(
                        f"{policy:>12} {r['requests']:>3} requests ({r['forwards']:>6} forwards), allocator "
                        f"{alloc:>8}: peak {r['peak_mb']:6.0f} MB, {r['wall_s']:6.1f} s [target <= 600 MB]"
                    )


if __name__ == "__main__":
    main()
