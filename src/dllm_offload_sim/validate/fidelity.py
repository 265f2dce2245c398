"""Fidelity: the same trace, policy and cache through the simulator and through the GPU replay.

One row per (trace, model, policy, cache, metric) with predicted (simulator), measured (GPU),
signed and absolute relative error. Counters (hits, demand copies, CPU experts) must agree exactly;
times may differ, and the report says by how much.
"""

from __future__ import annotations

import time
from dataclasses import fields
from typing import NamedTuple

import pandas as pd
import torch

from dllm_offload_sim.policies.base import PolicyContext
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.profiler.host_probe import (
    StealMeter,
    cpu_engine_probe_seconds,
    memory_bandwidth_gbps,
    settle_engine,
)
from dllm_offload_sim.schedule.batch import batched_forwards
from dllm_offload_sim.schedule.knowledge import combine_knowledge, request_profile
from dllm_offload_sim.validate.comparison import (
    COUNTERS,
    decision_us_per_layer,
    predicted_metrics,
    relative_error,
    simulate_as_replayed,
)
from dllm_offload_sim.validate.layer_timeline import layer_timeline
from dllm_offload_sim.runtime.replay import HostTimes, ReplayEngine, replay_summary
from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.shared_cpu_engines import SharedCpuEngines

# what the replay records per forward besides its time and counters: where its host time went
# (runtime.replay.HostTimes), the GPU work still queued once the host had issued the whole forward (~0:
# host-bound), and the grouped calls run eagerly (their experts' slots spanning two blocks) rather than as graphs
REPLAY_COLUMNS = tuple(f.name for f in fields(HostTimes)) + ("gpu_backlog_s", "eager_calls")


class FidelityRun(NamedTuple):
    """One validated (policy, cache): its fidelity rows, its per-forward table and its per-layer timeline."""

    rows: list
    forwards: pd.DataFrame
    layers: pd.DataFrame | None = None


class RunPlan(NamedTuple):
    """One (policy, cache) simulated and ready to replay: its prediction, the simulator's schedule the replays
    follow, and the decision time it was charged (``simulated`` back to back, ``charged`` after the profile's
    factor), which with the same inputs makes the same simulation again."""

    trace: object
    make_policy: object
    label: str
    cache: int
    cost: object  # the cost model, the charged decision time in it
    cpu_workers: int
    sim: object  # the simulation (per_forward, summary, schedule, layers)
    forwards: list  # the requests' forwards as the replay runs them
    knowledge: object  # request -> what the policy may know before it (the other requests' maps)
    simulated: float  # us per MoE layer
    charged: float
    simulate_s: float  # wall seconds of the simulations
    record_layers: bool


class Replay(NamedTuple):
    """One repeat of a run on the replay engine: what it measured per forward, its summary (with the host's
    memory bandwidth and the CPU engine's probe call just before it, and the share of CPU time the hypervisor stole
    during it), the host's time to launch a kernel, its per-layer stamps, the CPU engine
    it ran, the wall seconds it took to set up and to run, and the wall-clock time it finished (Unix seconds; NaN
    for a repeat stored without it), which places it in a sweep (``validate.sweep_drift``)."""

    per_forward: pd.DataFrame
    summary: dict
    host_launch_s: float
    layers: pd.DataFrame | None
    cpu_engine: str
    setup_s: float
    replay_s: float
    finished_unix_s: float = float("nan")


def plan_run(
    trace,
    make_policy,
    label: str,
    cache: int,
    cost,
    requests,
    cpu_workers: int = 1,
    charge_policy_time: bool = True,
    charge: tuple[float, float] | None = None,
    record_layers: bool = False,
) -> RunPlan:
    """Simulate one (policy, cache) for validation. ``charge_policy_time``: the policy's decisions run on the host
    between the GPU work of a layer, so the prediction charges the decision time per MoE layer that a simulation on
    this host measures, after one that warms the policy (compiling its kernels is not decision time), times the
    profile's ``runtime.policy_time_factor`` (a decision in the running replay over the same decision back to
    back); the prediction is the next simulation's. ``charge``: (simulated, charged) us per MoE layer from an
    earlier plan of the same run (with ``charge_policy_time``), taken instead of measuring again: a resumed run's
    repeats then follow the same schedule."""
    t_start = time.perf_counter()
    reqs = [trace.request(r) for r in requests]
    simulated = charged = 0.0
    if charge_policy_time:
        if charge is not None:
            simulated, charged = map(float, charge)
        else:
            simulated = decision_us_per_layer(trace, make_policy, cache, cost, requests, cpu_workers, reqs)
            charged = simulated * cost.policy_time_factor
        cost = cost.with_policy_time(charged)
    sim = simulate_as_replayed(
        trace,
        make_policy(),
        cache,
        cost,
        requests,
        cpu_workers,
        reqs,
        record_schedule=True,
        record_layers=record_layers,
    )
    topo = trace.topology
    know = {r.request_id: request_profile(r, topo) for r in reqs}
    by_id = {r.request_id: r for r in reqs}
    ids = [r.request_id for r in reqs]
    return RunPlan(
        trace,
        make_policy,
        label,
        int(cache),
        cost,
        cpu_workers,
        sim,
        list(batched_forwards(reqs, 1, topo.n_experts)),  # the replay reads them more than once
        lambda b: combine_knowledge([know[i] for i in ids if i != ids[b]], by_id.__getitem__, topo),
        simulated,
        charged,
        time.perf_counter() - t_start,
        record_layers,
    )


def replay_once(
    plan: RunPlan,
    host: HostExperts,
    engines: SharedCpuEngines,
    graphs: ReplayGraphs,
    device="cuda",
    n_real_layers: int = 1,
    cpu_engine: str | None = None,
) -> Replay:
    """One independent replay of ``plan`` (a fresh policy and replay engine), on ``host``'s experts, a CPU engine
    lent by ``engines`` (default: the one the profile measured, or ``cpu_engine``) and the non-expert ``graphs``."""
    topo = plan.trace.topology
    t0 = time.perf_counter()
    drv = ResidencyDriver(
        plan.make_policy(),
        PolicyContext.of(topo, plan.cache, plan.cost, plan.cpu_workers, plan.trace.block_length),
    )
    eng = ReplayEngine(
        topo,
        drv,
        plan.cost,
        device=device,
        n_real_layers=n_real_layers,
        cpu_workers=plan.cpu_workers,
        host=host,
        schedule=plan.sim.schedule,
        cpu_engine=cpu_engine,
        cpu_engines=engines,
        graphs=graphs,
        record_layers=plan.record_layers,
    )
    try:
        eng.prepare(plan.forwards)
        # the CPU engine's speed and the host's memory speed now, vs the CPU curve's; the engine first, so that its
        # threads, which spin a while after a call, are idle again once the memory probe's ~0.3 s have passed. A
        # fresh engine settles first, as the profiler's did before its curve
        if engines.first_lending(eng.cpu):
            settle_engine(eng.cpu, topo.n_experts, topo.hidden, host.w13.dtype)
        probe_s = cpu_engine_probe_seconds(eng.cpu, topo.n_experts, topo.hidden, host.w13.dtype)
        mem_gbps = memory_bandwidth_gbps()
        steal = StealMeter()
        t1 = time.perf_counter()
        mpf = eng.run(plan.forwards, plan.knowledge)
        t2 = time.perf_counter()
        steal_frac = steal.fraction()
        engine_name = eng.cpu.name
    finally:
        eng.close()
    summary = {
        **replay_summary(mpf),
        "host_mem_gbps": mem_gbps,
        "cpu_probe_ms": 1e3 * probe_s,
        "host_steal_frac": float("nan") if steal_frac is None else steal_frac,
    }
    return Replay(
        mpf, summary, float(eng.host_launch_s), eng.layers_table(), engine_name, t1 - t0, t2 - t1, time.time()
    )


def finish_run(plan: RunPlan, replays: list[Replay]) -> FidelityRun:
    """The run's fidelity rows from its repeats: the measured values are the repeat with the median TPOT's (the
    lower middle if even), and every row carries the repeats' ``measured_min`` / ``measured_max``, so a run's
    noise is measured beside its error. Counters agree only if they agree in every repeat."""
    topo = plan.trace.topology
    pf = plan.sim.per_forward
    pred = predicted_metrics(plan.sim)
    order = sorted(range(len(replays)), key=lambda i: replays[i].summary["tpot_ms"])
    med = replays[order[(len(order) - 1) // 2]]
    mpf, meas = med.per_forward, med.summary
    # each key over the repeats that have it (a resumed run can hold repeats stored before a probe existed)
    spread = {k: (min(v), max(v)) for k in meas for v in [[r.summary[k] for r in replays if k in r.summary]]}
    wall = {
        "simulate_s": plan.simulate_s,
        "setup_s": sum(r.setup_s for r in replays),
        "replay_s": sum(r.replay_s for r in replays),
    }
    forwards_table = pd.DataFrame(
        {
            "forward": pf.forward,
            "phase": pf.phase,
            "predicted_s": pf.duration_s,
            "measured_s": mpf.duration_s.to_numpy(),
            "model": topo.name,
            "policy": plan.label,
            "cache": plan.cache,
            "hits": pf.hits,
            "to_gpu": pf.to_gpu,
            "to_cpu": pf.to_cpu,
            "predicted_cpu_path_s": pf.cpu_path_s,
            **{f"measured_{k}": mpf[k].to_numpy() for k in REPLAY_COLUMNS},
        }
    )
    cost = plan.cost

    def row(metric, p, m, err, lo_hi=(float("nan"), float("nan"))):
        return {
            "trace": str(plan.trace.path.name),
            "model": topo.name,
            "policy": plan.label,
            "cache": plan.cache,
            "metric": metric,
            "predicted": p,
            "measured": m,
            "signed_rel_err": err,
            "abs_rel_err": abs(err),
            "charged_policy_us_per_layer": plan.charged,
            "simulated_policy_us_per_layer": plan.simulated,
            "policy_time_factor": cost.policy_time_factor,
            "repeats": len(replays),
            "cpu_engine": med.cpu_engine,
            **wall,
            "measured_min": float(lo_hi[0]),
            "measured_max": float(lo_hi[1]),
        }

    rows = []
    for metric in ("tpot_ms", "prefill_ms", *COUNTERS):
        p, m = float(pred[metric]), float(meas[metric])
        rows.append(row(metric, p, m, relative_error(p, m), spread[metric]))
    # the host's time to launch one kernel when the profile was measured vs during this replay: the
    # runtime's host work (plans, launches, copies) scales with it
    prof_launch = float(cost.profile.stamp.get("host_launch_us", float("nan")))
    run_launch = 1e6 * med.host_launch_s
    rows.append(row("host_launch_us", prof_launch, run_launch, relative_error(prof_launch, run_launch)))
    # the host's memory bandwidth when the CPU curve was timed vs before each replay: a CPU expert streams its weights,
    # so its cost follows the bandwidth, which a shared host's neighbours move
    prof_mem = cost.profile.cpu_curve_gbps()
    prof_mem = float("nan") if prof_mem is None else prof_mem
    rows.append(
        row(
            "host_mem_gbps",
            prof_mem,
            meas["host_mem_gbps"],
            relative_error(prof_mem, meas["host_mem_gbps"]),
            spread["host_mem_gbps"],
        )
    )
    # the CPU engine's probe call when the CPU curve was timed vs before each replay: the engine's own speed, which
    # a shared host's neighbours move too (absent from repeats stored before the probe)
    if "cpu_probe_ms" in meas:
        prof_probe = cost.profile.cpu_probe_s()
        prof_probe = float("nan") if prof_probe is None else 1e3 * prof_probe
        rows.append(
            row(
                "cpu_probe_ms",
                prof_probe,
                meas["cpu_probe_ms"],
                relative_error(prof_probe, meas["cpu_probe_ms"]),
                spread["cpu_probe_ms"],
            )
        )
    rows.append(
        row(
            "policy_ms_per_forward",
            float("nan"),
            meas["policy_ms_per_forward"],
            float("nan"),
            spread["policy_ms_per_forward"],
        )
    )
    layers = (
        layer_timeline(plan.sim.layers, med.layers, topo.name, plan.label, plan.cache)
        if plan.record_layers
        else None
    )
    return FidelityRun(rows, forwards_table, layers)


def fidelity_rows(
    trace,
    make_policy,
    label: str,
    cache: int,
    cost,
    requests,
    cpu_workers: int = 1,
    n_real_layers: int = 1,
    device="cuda",
    host=None,
    charge_policy_time: bool = True,
    repeats: int = 1,
    cpu_engine: str | None = None,
    cpu_engines: SharedCpuEngines | None = None,
    replay_graphs: ReplayGraphs | None = None,
    record_layers: bool = False,
) -> FidelityRun:
    """Simulate and replay one (policy, cache), its ``repeats`` back to back: one row per metric, predicted vs
    measured per forward, and with ``record_layers`` per MoE layer (:func:`layer_timeline`; None without).
    :func:`plan_run` simulates (``charge_policy_time``), :func:`replay_once` replays and :func:`finish_run` takes the
    median repeat. ``cpu_engine``: the replay's CPU engine (default: the one the profile measured), built once for
    the repeats, or lent by ``cpu_engines`` (a sweep's: built once for all its runs); likewise the non-expert work's
    captured graphs (``replay_graphs``). A sweep interleaves its runs' repeats instead (``validate.sweep``).
    """
    if int(repeats) < 1:
        raise ValueError(f"fidelity_rows: repeats must be >= 1, got {repeats!r}")
    plan = plan_run(
        trace,
        make_policy,
        label,
        cache,
        cost,
        requests,
        cpu_workers,
        charge_policy_time,
        record_layers=record_layers,
    )
    # the repeats share the host experts and the CPU engine (a sweep passes its own, shared by all its runs)
    host = host or HostExperts(
        trace.topology, n_real_layers=n_real_layers, pin=torch.device(device).type == "cuda"
    )
    engines = cpu_engines or SharedCpuEngines()
    graphs = replay_graphs or ReplayGraphs(trace.topology, device)
    try:
        replays = [
            replay_once(plan, host, engines, graphs, device, n_real_layers, cpu_engine)
            for _ in range(int(repeats))
        ]
    finally:
        if cpu_engines is None:
            engines.close()
        if replay_graphs is None:
            graphs.close()
    return finish_run(plan, replays)
