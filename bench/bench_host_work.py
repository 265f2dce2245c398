"""The replay's host work per MoE layer, the policy's decisions excluded (run on the GPU host).

    python bench/bench_host_work.py [--profile P] [--trace T] [--policies oled,ktransformers,lru,full_residency]
        [--cache 40] [--rounds 2] [--json out.json]

The runtime issue's target: <= 100 us of host time per MoE layer, from the layer's routing on the host to its last
launch, the policy's decisions and the schedule's prefetch events excluded. This replays request 0 of the trace under
each policy as ``dllm-validate`` does (``validate.fidelity.plan_run`` and ``replay_once``: the same CPU engine, the
same captured graphs), the policies interleaved over ``--rounds`` rounds, and prints per policy and round the medians
over its decode forwards, per MoE layer: the host's routing-to-launch and, of it, the bookkeeping (routing to the
first expert work), the CPU call's submission, the demand copies' issue; per grouped call its issue (the routing's
upload and the graph's launch); and the decision time per layer and the measured TPOT beside them; then what the
profile charges for the same steps (its runtime terms). On a shared host
the numbers move between rounds: compare two builds by running this on each, interleaved, on one machine.

``--beside none,memory,engine`` replays each policy also beside a load, interleaved with the plain replays: ``memory``
streams host memory in ``--load-threads`` threads (``MemoryLoad``, as the CPU expert engine streams weights);
``engine`` runs the profile's CPU expert engine with its threads in a child process of its own, call after call
(``EngineLoad``). Whether the host's steps slow down beside either, as they do in the runs that use the CPU engine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from dllm_offload_sim.traces.cli import HelpFormatter

# what the table shows per MoE layer of a decode forward: (column, per-forward field of the replay, divided by)
PER_LAYER = (
    ("host_us", "host_issue_s"),
    ("bookkeeping_us", "bookkeeping_s"),
    ("cpu_issue_us", "cpu_issue_s"),
    ("copy_issue_us", "copy_issue_s"),
    ("decision_us", "policy_s"),
)
TARGET_US = 100.0  # host time per MoE layer, decisions excluded


def host_work(per_forward: pd.DataFrame, n_moe_layers: int) -> dict:
    """Medians over the measured decode forwards of ``per_forward`` (a replay's per-forward table) of the host's work
    per MoE layer (us, :data:`PER_LAYER`) and per grouped call (``grouped_issue_us``), and the decode forwards
    counted."""
    from dllm_offload_sim.traces.schema import PREFILL

    d = per_forward[per_forward.measured & (per_forward.phase != PREFILL)]
    if d.empty:
        raise ValueError("host_work: the replay has no measured decode forward")
    out = {col: 1e6 * float(d[field].median()) / n_moe_layers for col, field in PER_LAYER}
    per_call = (d.grouped_issue_s / d.grouped_calls.where(d.grouped_calls > 0)).dropna()
    out["grouped_issue_us"] = 1e6 * float(per_call.median()) if len(per_call) else float("nan")
    out["decode_forwards"] = int(len(d))
    return out


def bench(
    profile: str,
    trace_path: str | None,
    policies: list[str],
    cache: int,
    rounds: int,
    device: str,
    beside: tuple = ("none",),
    load_threads: int | None = None,
    load_mib: int = 64,
) -> list:
    """One row per (round, policy, load beside): :func:`host_work` of a replay of request 0, and its TPOT. ``beside``:
    ``none`` (the replay alone), ``memory`` (beside a ``MemoryLoad`` of ``load_threads`` threads) and/or ``engine``
    (beside an ``EngineLoad``: the profile's CPU engine with its threads), each policy's replays under them in turn
    within a round."""
    unknown = [b for b in beside if b not in BESIDE]
    if unknown or not beside:
        raise ValueError(
            f"bench_host_work: --beside takes {', '.join(BESIDE)}, got {', '.join(beside) or 'nothing'}"
        )
    loads = {"none": None}
    import torch

    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.costmodel.profile import load_profile
    from dllm_offload_sim.profiler.host_load import EngineLoad, MemoryLoad
    from dllm_offload_sim.runtime.cpu_engine import default_native_threads
    from dllm_offload_sim.runtime.host_experts import HostExperts
    from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
    from dllm_offload_sim.runtime.shared_cpu_engines import SharedCpuEngines
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.traces.shipped import default_trace_path, resolve_trace
    from dllm_offload_sim.validate.fidelity import plan_run, replay_once
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    cost = CostModel(load_profile(profile))
    trace = Trace.open(resolve_trace(trace_path) if trace_path else default_trace_path())
    topo = trace.topology
    configs = {p: policy_config(p) for p in policies}  # unknown names fail before any replay
    host = HostExperts(topo, pin=torch.device(device).type == "cuda")
    engines, graphs = SharedCpuEngines(), ReplayGraphs(topo, device)
    plans, rows = {}, []
    try:
        if "engine" in beside:  # the profile's engine and threads, as the replay runs them
            threads = cost.cpu_expert_threads
            threads = min(threads, os.cpu_count() or threads) if threads else None
            loads["engine"] = EngineLoad(topo, cost.cpu_engine, threads).start()
        for r in range(rounds):
            for p in policies:
                if (
                    p not in plans
                ):  # the simulation the replay follows (its prefetch schedule), once per policy
                    plans[p] = plan_run(
                        trace,
                        lambda c=configs[p]: make_policy(c),
                        p,
                        cache,
                        cost,
                        [0],
                        charge_policy_time=False,
                    )
                for b in beside:
                    load = (
                        MemoryLoad(load_threads or default_native_threads(), load_mib)
                        if b == "memory"
                        else loads[b]
                    )
                    with load if load is not None else contextlib.nullcontext():
                        rep = replay_once(plans[p], host, engines, graphs, device)
                    rows.append(
                        {
                            "round": r,
                            "policy": p,
                            "cache": cache,
                            "beside": b,
                            **host_work(rep.per_forward, topo.n_moe_layers),
                            "tpot_ms": rep.summary["tpot_ms"],
                            "cpu_engine": rep.cpu_engine,
                            "load_gbps": load.gbps if isinstance(load, MemoryLoad) else float("nan"),
                            "load_calls_per_s": load.calls_per_s
                            if isinstance(load, EngineLoad)
                            else float("nan"),
                        }
                    )
                    print(line(rows[-1]), flush=True)
    finally:
        if loads.get("engine") is not None:
            loads["engine"].close()
        engines.close()
        graphs.close()
    return rows


BESIDE = ("none", "memory", "engine")  # what a replay runs beside: nothing, a MemoryLoad or an EngineLoad
HEADER = (
    f"{'round':>5} {'policy':>16} {'cache':>5} {'beside':>6} {'host/layer':>10} {'bookkeeping':>11} "
    f"{'CPU-call issue':>14} {'copy issue':>10} {'grouped/call':>12} {'decision':>8} {'TPOT ms':>8} "
    f"{'load':>9}   (us per MoE layer; grouped: per call; load: GB/s or engine calls/s)"
)


def line(row: dict) -> str:
    """One printed row of :func:`bench`."""
    return (
        f"{row['round']:>5} {row['policy']:>16} {row['cache']:>5} {row['beside']:>6} {row['host_us']:10.0f} "
        f"{row['bookkeeping_us']:11.0f} {row['cpu_issue_us']:14.0f} {row['copy_issue_us']:10.0f} "
        f"{row['grouped_issue_us']:12.0f} {row['decision_us']:8.0f} {row['tpot_ms']:8.2f} "
        f"{row['load_gbps'] if row['beside'] == 'memory' else row['load_calls_per_s']:9.1f}"
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_host_work.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--profile",
        default="h200-mini",
        help="the profile the replay's CPU engine and the policies' costs "
        "come from (a path or a shipped name; default h200-mini)",
    )
    p.add_argument(
        "--trace", default=None, help="the trace whose request 0 is replayed (default: the shipped one)"
    )
    p.add_argument(
        "--policies", default="oled,ktransformers,lru,full_residency", help="comma-separated policies"
    )
    p.add_argument("--cache", type=int, default=40, help="expert slots per MoE layer (default 40)")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the policies, interleaved (default 2)")
    p.add_argument(
        "--beside",
        default="none",
        help="comma-separated loads each replay runs beside, in turn: none "
        "(alone), memory (threads streaming host memory, as the CPU engine does), engine (the profile's CPU "
        "engine called in a loop by a process of its own); default none",
    )
    p.add_argument(
        "--load-threads",
        type=int,
        default=None,
        help="threads of the memory load (default: every core but two, as the CPU engine's)",
    )
    p.add_argument(
        "--device", default=None, help="default: cuda where there is one (the target is a GPU host's)"
    )
    p.add_argument("--json", default=None, help="also write the rows to this file")
    a = p.parse_args(argv)
    policies = [x for x in a.policies.split(",") if x]
    beside = tuple(x for x in a.beside.split(",") if x)
    if not policies or a.cache < 1 or a.rounds < 1:
        print("bench_host_work: give at least one policy, --cache >= 1 and --rounds >= 1", file=sys.stderr)
        return 2
    if (
        not beside
        or any(b not in BESIDE for b in beside)
        or (a.load_threads is not None and a.load_threads < 1)
    ):
        print(
            f"bench_host_work: --beside takes {', '.join(BESIDE)} (got {a.beside!r}) and --load-threads >= 1",
            file=sys.stderr,
        )
        return 2
    import torch

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    print(HEADER, flush=True)
    rows = bench(a.profile, a.trace, policies, a.cache, a.rounds, device, beside, a.load_threads)
    df = pd.DataFrame(rows)
    for (pol, b), g in df.groupby(["policy", "beside"], sort=False):
        lo, hi = float(np.min(g.host_us)), float(np.max(g.host_us))
        where = (
            ""
            if b == "none"
            else f" beside the memory load ({np.nanmedian(g.load_gbps):.0f} GB/s)"
            if b == "memory"
            else f" beside the engine load ({np.nanmedian(g.load_calls_per_s):.0f} calls/s)"
        )
        print(
            f"{pol}: host work per MoE layer {lo:.0f}-{hi:.0f} us over {len(g)} rounds{where} "
            f"[target <= {TARGET_US:.0f} us]"
        )
    print(profile_line(a.profile))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


def profile_line(profile: str) -> str:
    """What the profile charges for the same host steps (its runtime terms), to set beside the measured ones."""
    from dllm_offload_sim.costmodel.profile import load_profile

    rt = load_profile(profile).runtime or {}
    us = lambda k: f"{1e6 * rt[k]:.0f} us" if k in rt else "not measured"  # noqa: E731
    return (
        f"the profile charges: bookkeeping {us('bookkeeping_s')} per MoE layer, a CPU call's issue "
        f"{us('cpu_issue_s')}, a grouped call's issue {us('grouped_issue_s')}"
    )


if __name__ == "__main__":
    sys.exit(main())
