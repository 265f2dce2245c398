"""Simulator speed: one 1024-token mini request under OLED, and the default main job.

    python bench/bench_sim.py            # prints seconds and simulated MoE-layer executions per second
    python bench/bench_sim.py --skip-main --one-request all   # one request under every shipped policy
    python bench/bench_sim.py --skip-main --policies lru,finemoe,oled   # also each policy's decision time
    python bench/bench_sim.py --skip-main --policies finemoe,moe_infinity --all-requests   # ... over all 6 requests
    python bench/bench_sim.py --skip-main --command   # ``dllm-sim`` as typed: numba's first compile, then cached
    python bench/bench_sim.py --skip-main --per-run lru,oled --repeats 2   # CPU per run, as the main job runs it

Targets (docs/performance.md): one 1024-token LLaDA2.0-mini request <= 0.1 s under every shipped policy; OLED
<= 10 us and Naive-LRU <= 3 us of decision per MoE layer; the whole default main job (every policy of the table
at Cache 40 and 100 on the shipped trace), run as ``dllm-sim`` runs it (``table.jobs``: one worker process per
core), <= 8 s of CPU (its own and its workers').
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

from dllm_offload_sim.costmodel import CostModel
from dllm_offload_sim.policies.oled import OLEDPolicy
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace
from dllm_offload_sim.traces.cli import HelpFormatter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_recipes import machine  # noqa: E402  (a script beside this one)


ONE_REQUEST_TARGET_S = 0.1
DECISION_TARGET_US = {"oled": 10.0, "naive_lru": 3.0}
MAIN_JOB_TARGET_CPU_S = 8.0


def bench_one_requests(policies: list[str], repeats: int = 3, cache: int = 40) -> dict:
    """Each policy's wall time for one 1024-token mini request at ``cache`` (``simulate`` as a user calls it: the
    request read from its trace, its forwards batched, the run's tables made), the best and the median of
    ``repeats`` rounds with the policies interleaved. Returns {policy: (best s, median s)}."""
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    with tempfile.TemporaryDirectory() as d:
        path = write_synthetic_trace(
            SynthConfig(n_requests=1, max_new_tokens=1024, seed=0), os.path.join(d, "t")
        )
        tr = Trace.open(path)
        cm = CostModel("h200-mini")
        gc.freeze()
        times = {n: [] for n in policies}
        for n in policies:  # one run each first: numba loads its kernels from the cache
            simulate(tr, make_policy(policy_config(n, [])), cache, cm)
        for _ in range(repeats):
            for n in policies:
                t0 = time.perf_counter()
                simulate(tr, make_policy(policy_config(n, [])), cache, cm)
                times[n].append(time.perf_counter() - t0)
    return {n: (min(t), sorted(t)[len(t) // 2]) for n, t in times.items()}


def bench_one_request(repeats: int = 3, cache: int = 40) -> dict:
    with tempfile.TemporaryDirectory() as d:
        path = write_synthetic_trace(
            SynthConfig(n_requests=1, max_new_tokens=1024, seed=0), os.path.join(d, "t")
        )
        tr = Trace.open(path)
        cm = CostModel("h200-mini")
        gc.freeze()  # as sim.app.run_group does: the garbage collector's full passes skip what is loaded
        times, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            r = simulate(tr, OLEDPolicy(), cache, cm)  # includes reading the request from Parquet
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        s = r.summary
        layers = s["decode_forwards"] * tr.topology.n_moe_layers
        best = min(times)
        return {
            "case": f"1 x 1024-token mini request, oled, cache {cache}",
            "best_s": best,
            "best_cpu_s": min(cpu),
            "median_s": sorted(times)[len(times) // 2],
            "moe_layer_execs": layers,
            "moe_layer_execs_per_s": layers / best,
            "policy_us_per_layer": s["policy_us_per_layer"],
            "tpot_ms": s["tpot_ms"],
        }


def bench_decisions(
    policies: list[str], repeats: int = 3, cache: int = 40, all_requests: bool = False
) -> list[dict]:
    """Each policy's decision time per MoE layer (``policy_us_per_layer``, the best of ``repeats`` runs; and of it, the
    per-forward hooks' time per forward, ``policy_hooks_us_per_forward``, the best of its runs) on the
    default trace's request 0 (or all its requests) at ``cache``, runs interleaved policy by policy (the host's
    speed moves). Trajectory-matching policies (FineMoE, MoE-Infinity) match against the other requests' maps, so
    their time grows with the requests simulated together."""
    from dllm_offload_sim.traces.shipped import default_trace_path
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    tr = Trace.open(default_trace_path())
    cm = CostModel("h200-mini")
    best = {n: float("inf") for n in policies}
    hooks = dict(best)
    for _ in range(repeats):
        for n in policies:
            r = simulate(
                tr, make_policy(policy_config(n, [])), cache, cm, requests=None if all_requests else [0]
            )
            best[n] = min(best[n], r.summary["policy_us_per_layer"])
            hooks[n] = min(hooks[n], r.summary["policy_hooks_us_per_forward"])
    L = tr.topology.n_moe_layers
    return [
        {
            "policy": n,
            "us_per_layer": best[n],
            "ms_per_forward": best[n] * L / 1e3,
            "hooks_us_per_forward": hooks[n],
        }
        for n in policies
    ]


def bench_runs(policies: list[str], rounds: int = 2, caches=(40, 100)) -> dict:
    """The CPU time of ``simulate()`` per run of each policy at each cache on the default trace with its requests
    loaded, as a ``dllm-sim`` worker runs the main table (the requests, their knowledge, their forwards and the layer
    shapes' table shared by the runs): each run once to warm up, then timed; ``rounds`` rounds, policies
    interleaved. Returns {(policy, cache): [seconds per round]}."""
    from dllm_offload_sim.sim.closed_form import ExpertCallsTable
    from dllm_offload_sim.traces.shipped import default_trace_path
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    tr = Trace.open(default_trace_path())
    cm = CostModel("h100-mini")
    ids = tr.request_ids
    shared = dict(
        requests=ids,
        loaded=[tr.request(r) for r in ids],
        knowledge={},
        forwards_cache={},
        calls=ExpertCallsTable(cm),
    )
    gc.freeze()
    out = {(n, c): [] for n in policies for c in caches}
    for _ in range(rounds):
        for n in policies:
            for c in caches:
                simulate(tr, make_policy(policy_config(n, [])), c, cm, **shared)
                c0 = time.process_time()
                simulate(tr, make_policy(policy_config(n, [])), c, cm, **shared)
                out[(n, c)].append(time.process_time() - c0)
    return out


def bench_main_job() -> dict:
    """The default main job's table made in this process as ``dllm-sim`` makes it (its workers included): wall time,
    and CPU time of this process and its workers (the interpreter's start and imports excluded)."""
    import resource

    from dllm_offload_sim.sim.app import run_table

    t0, c0 = time.perf_counter(), time.process_time()
    k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    table = run_table(None, progress=False)
    wall = time.perf_counter() - t0
    k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    children = (k1.ru_utime - k0.ru_utime) + (k1.ru_stime - k0.ru_stime)
    return {
        "case": "default main job (the table's policies x Cache 40, 100, shipped trace)",
        "wall_s": wall,
        "cpu_s": time.process_time() - c0 + children,
        "runs": len(table),
        "sum_sim_wall_s": float(table.sim_wall_s.sum()),
    }


def bench_command() -> dict:
    """``dllm-sim quiet=true`` run as a user types it (a new process: imports, the trace, the table), first with an
    empty numba cache (the first run on a machine compiles the policy kernels) and then again with that cache."""
    import shutil
    import subprocess

    exe = shutil.which("dllm-sim") or "dllm-sim"
    out = {}
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(d, "numba"))
        for case in ("first", "cached"):
            t0 = time.perf_counter()
            subprocess.run(
                [exe, "quiet=true", f"hydra.run.dir={os.path.join(d, case)}"],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            out[f"{case}_s"] = time.perf_counter() - t0
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_sim.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-main", action="store_true", help="only the one-request benchmark")
    p.add_argument(
        "--policies",
        default="",
        help="comma-separated policies whose decision time per layer to print "
        "(default trace, request 0, Cache 40)",
    )
    p.add_argument(
        "--all-requests", action="store_true", help="time the decisions over all the trace's requests"
    )
    p.add_argument(
        "--one-request",
        default="",
        metavar="POLICIES",
        help="comma-separated policies (or 'all': every shipped one) whose wall time for one 1024-token request at "
        "Cache 40 to print (--repeats rounds, interleaved)",
    )
    p.add_argument(
        "--per-run",
        default="",
        metavar="POLICIES",
        help="comma-separated policies whose CPU time per run at Cache 40 and 100 to print, as the main job's "
        "workers run them (default trace, its requests loaded; --repeats rounds)",
    )
    p.add_argument(
        "--command",
        action="store_true",
        help="also time the dllm-sim command itself, with an empty numba cache and then with it filled",
    )
    args = p.parse_args(argv)
    print(f"machine: {machine()}")
    r = bench_one_request(args.repeats)
    print(
        f"{r['case']}: best {r['best_s']:.3f} s wall, {r['best_cpu_s']:.3f} s CPU (median {r['median_s']:.3f} s), "
        f"{r['moe_layer_execs']} MoE-layer "
        f"executions, {r['moe_layer_execs_per_s']:.0f} /s, policy {r['policy_us_per_layer']:.1f} us/layer "
        f"[target <= {ONE_REQUEST_TARGET_S:g} s]"
    )
    for d in bench_decisions(
        [n for n in args.policies.split(",") if n], args.repeats, all_requests=args.all_requests
    ):
        target = DECISION_TARGET_US.get(d["policy"])
        print(
            f"{d['policy']:>14} decides in {d['us_per_layer']:7.1f} us per MoE layer "
            f"({d['ms_per_forward']:.3f} ms per forward; of it, its per-forward hooks {d['hooks_us_per_forward']:.1f} "
            f"us per forward), best of {args.repeats}" + (f" [target <= {target:g} us]" if target else "")
        )
    one = args.one_request.split(",") if args.one_request not in ("", "all") else []
    if args.one_request == "all":
        from dllm_offload_sim.wiring.build import policy_names

        one = policy_names()
    for n, (best, median) in bench_one_requests([x for x in one if x], args.repeats).items():
        print(
            f"{n:>24}: one 1024-token request in {best:.3f} s (median {median:.3f} s) "
            f"[target <= {ONE_REQUEST_TARGET_S:g} s: {'met' if best <= ONE_REQUEST_TARGET_S else 'not met'}]"
        )
    per_run = [n for n in args.per_run.split(",") if n]
    if per_run:
        for (n, c), secs in bench_runs(per_run, args.repeats).items():
            print(f"{n:>24} Cache {c:>3}: {min(secs):.3f}-{max(secs):.3f} s CPU per run ({len(secs)} rounds)")
    if not args.skip_main:
        m = bench_main_job()
        print(
            f"{m['case']}: {m['wall_s']:.1f} s wall, {m['cpu_s']:.1f} s CPU for {m['runs']} runs "
            f"[target <= {MAIN_JOB_TARGET_CPU_S:g} s CPU]"
        )
    if args.command:
        c = bench_command()
        print(
            f"dllm-sim (the main job as typed, a new process): {c['first_s']:.1f} s with an empty numba cache "
            f"(its kernels compiled), {c['cached_s']:.1f} s with them cached"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
