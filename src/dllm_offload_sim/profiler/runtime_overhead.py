"""The runtime's host time per MoE layer beyond the operations a profile's curves time (its ``runtime``).

Two parts, each measured on the runtime itself (``validate/``), never fitted to a validation run:

* ``routing_sync_seconds``: a layer's routing is on the host only after a stream synchronisation
  behind the layer's non-expert work; the host wakes up some time after the GPU finishes. Measured as
  the wall time of (replay the non-expert graph, synchronise) minus the graph's GPU time.
* ``bookkeeping_seconds``: what the replay's host does between having the routing and issuing the
  layer's first expert work (residency lookups, the policy's view, checking its decision, slot
  tables), policy decisions excluded. Measured by replaying random decode routing under full residency
  (every expert a hit: nothing else on the host's path) on a two-MoE-layer cut of the model, as the
  median over forwards of ``ReplayEngine``'s ``bookkeeping_s`` per MoE layer.
* ``residual_split``: what a resident forward takes beyond everything the profile charges it (its curves, the routing
  wait, the bookkeeping, the policy's measured time), split into a part per MoE layer (``layer_residual_s``) and a
  part per forward (``forward_residual_s``, the replay's own work at a forward's start and end). The same replay on
  the two-MoE-layer cut and on a cut of ``RESIDUAL_DEEP_CUT`` MoE layers, timed in alternating parts with the CPU-call
  probe below (``cut_probes``) so that a drift of the host's speed falls on all of them alike: the median over
  forwards of (measured forward - the simulator's forward under full residency) on each, and the line through the
  two. A per-layer charge alone, timed on the two-layer cut, would spread the per-forward part over two layers and
  charge it again in every layer of a deeper stack.
* ``cpu_call_seconds``: what a layer's CPU call costs in the running replay beyond the profile's CPU
  curve and call overhead (timed with the runtime idle): on the same cut, a probe policy keeps all but a
  few experts of each layer resident and runs every miss on the CPU (~``CPU_PROBE_EXPERTS`` per layer,
  as OLED and clairvoyant_coop send at decode); the median over forwards of (the replay's job building
  and CPU compute - what the profile charges for the same experts and tokens) per CPU call, >= 0.
* ``cpu_issue_seconds``: on the same probe, the host time of submitting each CPU call (``HostTimes.cpu_issue_s``),
  which the runtime spends before it issues the layer's copies and grouped calls (the simulator delays the layer's
  GPU path by it).
* ``beside_engine_terms``: the bookkeeping and a grouped call's issue beside the CPU expert engine. On the lent hosts
  the host's steps run slower in a run whose layers call the engine than the full-residency probe times them (the
  engine's threads stream experts' weights through the caches and memory the host thread works from). The CPU-call
  probe's replay (every layer calls the engine) gives the bookkeeping per MoE layer (``bookkeeping_cpu_s``), and its
  grouped call's issue over the full-residency probe's on the same cut (the two timed in alternating parts,
  ``cut_probes``) scales ``grouped_issue_s`` (timed on the whole stack) into ``grouped_issue_cpu_s``.
* ``copy_contention_slowdowns``: a layer's CPU call and its demand copies both read host memory, so each runs slower
  while the other runs (``costmodel.contention``). A CPU call over ``CONTENTION_EXPERTS`` experts x 1 token (a decode
  call) on the profile's CPU engine, alone and with ``CONTENTION_COVER`` times its length of demand copies issued after
  it (as the replay issues a layer's copies), round-robin: its compute (a stream-ordered call's on the GPU's clock, up
  to the native task's end, so the result's copy that queues behind the copies does not count) beside over alone, less
  one, is ``cpu_slowdown_beside_copies``. Copies of ``1 / CONTENTION_COVER`` of the call's length, alone and issued
  after such a call, timed on the copy stream, give ``copies_slowdown_beside_cpu`` the same way.
* ``cpu_busy_gpu_seconds``: how much longer a CPU call's path takes while the GPU works beside it for the call's
  whole length. A cooperative layer runs its CPU call while its copies and grouped calls occupy the GPU, and such a
  call takes longer than alone, whether the GPU copies or computes (docs/cost-model.md, "A CPU call while the GPU
  works beside it"). One call of ``CPU_BUSY_ROWS`` rows routed top-k, ``CPU_BUSY_EXPERTS`` of its experts on the CPU (the replay's layout),
  alone and with bf16 matmuls issued after it that outlast it (compute rather than copies, so that the host-memory
  contention ``cpu_stall_per_copy_seconds`` measures is not counted twice), round-robin; the median path beside minus
  alone, >= 0. The path: a stream-ordered call's on the GPU's clock, otherwise submitted to the host holding its result.
* ``prefetch_start_seconds``: the host time the runtime spends per prefetch it starts (the schedule's start and
  arrival events: the victim's eviction, the slots, the copy's issue, the admission), the policy's hooks excluded.
  On the two-MoE-layer cut at half the experts, a probe policy copies misses on demand and, at the first MoE layer,
  plans ``PREFETCH_PROBE_EXPERTS`` prefetches of the second layer's highest experts (those already resident are passed
  over), each evicting a resident; the simulator's schedule is replayed, and the value is the median over measured
  forwards of the replay's ``prefetch_issue_s`` per prefetch copied.
* ``grouped_issue_seconds``: the host time the runtime spends issuing one grouped expert call (uploading the layer's
  routing and slot table, launching the call's graph) in the running replay of the whole layer stack (the same replay
  as ``policy_time_factor``'s), where the host's caches hold the whole runtime's data: the grouped-call curve times the
  same call back to back, where it issues several times faster. The simulator issues a layer's copies after its hits'
  call, so that call's host part delays them.
* ``policy_time_factor`` (a ratio, not seconds): how much longer a policy's decisions take in the running replay
  than the same decisions back to back in a simulation (which is how the validator measures the decision time it
  charges). In the replay a policy runs between a layer's GPU launches and copies, with the host's caches holding
  the runtime's data rather than the policy's. On the whole layer stack, as the validator replays it (the
  two-MoE-layer cut's far smaller working set reads too low a factor), ``POLICY_PROBE`` at half the experts (fewer
  where the device cannot hold that arena: :func:`probe_cache`) decides random decode routing in the replay and in a
  simulation
  of the same forwards (the same decisions); the factor is the replay's mean decision time per measured forward
  over the simulation's mean per forward.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import pandas as pd
import torch

from dllm_offload_sim.traces.schema import DENOISE
from dllm_offload_sim.traces.topology import ModelTopology

CPU_PROBE_EXPERTS = 6  # CPU experts per layer the cpu_call_seconds probe aims at (random routing)
RESIDUAL_DEEP_CUT = 6  # MoE layers of the deeper cut residual_split tells the per-forward part from
PROBE_ROUNDS = 2  # cut_probes times each of its probes in this many parts, in alternating order
CONTENTION_EXPERTS = 32  # experts (1 token each) of the CPU call copy_contention_slowdowns times
# its copies outlast the call by this factor, and the call outlasts the shorter copies by it
CONTENTION_COVER = 1.5
CPU_BUSY_ROWS, CPU_BUSY_EXPERTS = (
    32,
    8,
)  # the cpu_busy_gpu_seconds call: rows routed top-k, of whose experts 8 run
CPU_BUSY_MATMUL = 4096  # side of the bf16 matmuls that keep the GPU busy beside it
POLICY_PROBE = "lru"  # the policy whose decisions policy_time_factor times in the replay and in a simulation
PREFETCH_PROBE_EXPERTS = 8  # prefetches per forward the prefetch_start_seconds probe plans


def routing_sync_seconds(replay, gpu_seconds: float, device, reps: int = 20, warmup: int = 3) -> float:
    """Median host wall time of ``replay(); synchronise`` beyond ``gpu_seconds`` (>= 0)."""
    cuda = torch.device(device).type == "cuda"
    times = []
    for i in range(warmup + reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        replay()
        if cuda:
            torch.cuda.current_stream().synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return max(statistics.median(times) - gpu_seconds, 0.0)


def synthetic_decode_forwards(
    topo: ModelTopology, n: int, tokens: int, kv_len: int, warmup: int, seed: int = 0
):
    """``n`` decode forwards of ``tokens`` rows with uniformly random top-k routing (the first ``warmup``
    not measured)."""
    from dllm_offload_sim.schedule.batch import BatchedForward

    rng = np.random.default_rng(seed)
    L, E, k = topo.n_moe_layers, topo.n_experts, topo.top_k
    out = []
    for i in range(n):
        ids = np.argsort(rng.random((tokens, L, E)), axis=2)[:, :, :k].astype(np.int32)
        w = rng.random((tokens, L, k)).astype(np.float32)
        w /= w.sum(axis=2, keepdims=True)
        counts = np.stack([np.bincount(ids[:, j].ravel(), minlength=E) for j in range(L)])
        out.append(
            BatchedForward(
                index=i,
                batch=0,
                phase=DENOISE,
                n_tokens=tokens,
                kv_len=kv_len,
                ids=ids,
                weights=w,
                counts=counts,
                prev_confidence=np.full(tokens, np.nan, np.float32),
                own_confidence=np.full(tokens, np.nan, np.float32),
                masked=np.ones(tokens, bool),
                block_start=False,
                decoded={0: 1},
                measured=i >= warmup,
            )
        )
    return out


def moe_layer_cut(topo: ModelTopology, n: int) -> ModelTopology:
    """A dense layer, then ``n`` MoE layers of ``topo``'s shapes."""
    return dataclasses.replace(topo, n_layers=n + 1, moe_layers=tuple(range(1, n + 1)))


def _two_moe_layer_cut(topo: ModelTopology) -> ModelTopology:
    return moe_layer_cut(topo, 2)


def _replay_measured(cut: ModelTopology, pol, cache: int, cost, forwards: list, device, dtype):
    """Run ``forwards`` through a ReplayEngine under ``pol`` at ``cache``; its measured rows."""
    from dllm_offload_sim.policies.base import PolicyContext
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.runtime.replay import ReplayEngine

    eng = ReplayEngine(
        cut, ResidencyDriver(pol, PolicyContext.of(cut, cache, cost)), cost, device=device, dtype=dtype
    )
    try:
        pf = eng.run(forwards, lambda b: None)
    finally:
        eng.close()
    return pf[pf.measured]


def full_residency_probe(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    tokens: int = 16,
    kv_len: int = 256,
    moe_layers: int = 2,
):
    """Random decode routing replayed under full residency on a cut of ``moe_layers`` MoE layers: (cut, its forwards,
    the replay's measured rows)."""
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy

    cut = moe_layer_cut(topo, moe_layers)
    fwds = synthetic_decode_forwards(cut, forwards, tokens, kv_len, warmup)
    return cut, fwds, _replay_measured(cut, FullResidencyPolicy(), cut.n_experts, cost, fwds, device, dtype)


def bookkeeping_seconds(probe) -> float:
    """Median over measured forwards of the replay's bookkeeping per MoE layer (see module docstring);
    ``probe``: :func:`full_residency_probe`'s result."""
    cut, _, pf = probe
    return float(pf.bookkeeping_s.median()) / cut.n_moe_layers


def probe_if_it_fits(device, probe):
    """``probe()``, or None where the device cannot hold its arena (the allocator's cache emptied for what follows)."""
    try:
        return probe()
    except (MemoryError, torch.cuda.OutOfMemoryError):
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return None


def deep_residual_probe(topo: ModelTopology, cost, device, dtype=torch.bfloat16, **probe_args):
    """:func:`full_residency_probe` on the deepest cut of at most ``RESIDUAL_DEEP_CUT`` and at least three MoE layers
    whose arena the device holds (every expert of every layer resident: six layers of flash's experts take ~38 GB);
    None where the model has two MoE layers or fewer, or no such cut fits. ``probe_args``: the probe's forwards and
    warm-up."""
    for n in range(min(RESIDUAL_DEEP_CUT, topo.n_moe_layers), 2, -1):
        got = probe_if_it_fits(
            device, lambda: full_residency_probe(topo, cost, device, dtype, moe_layers=n, **probe_args)
        )
        if got is not None:
            return got
    return None


@dataclasses.dataclass(frozen=True)
class CutProbes:
    """The replays on cuts of the model that runtime terms are read from, each with its parts' measured rows pooled:
    full residency on the two-MoE-layer cut (``resident``: the bookkeeping, the residual's shallow point) and on the
    deepest cut the device holds (``deep``, None where none: the residual's deep point), and every miss on the CPU on
    the two-MoE-layer cut (``cpu``: a CPU call's cost and submission, the host's steps beside the engine)."""

    resident: tuple
    deep: tuple | None
    cpu: tuple


def cut_probes(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    rounds: int = PROBE_ROUNDS,
) -> CutProbes:
    """:class:`CutProbes`, each probe timed in ``rounds`` parts in alternating order: resident, deep, CPU, then CPU,
    deep, resident, and so on. Several terms compare two of them (the residual is the line through the resident and
    deep cuts; the host's steps beside the engine are the CPU probe's over the resident one's), so a host whose speed
    drifts while they run would otherwise put the drift into those terms. Every part of a probe replays the same
    forwards, ``warmup`` unmeasured ones and then ``(forwards - warmup) // rounds`` measured ones. The first deep part
    finds the deepest cut the device holds (:func:`deep_residual_probe`); the later ones reuse its depth, and one the
    device cannot hold then is left out."""
    args = {"forwards": warmup + max(1, (forwards - warmup) // rounds), "warmup": warmup}
    parts = {"resident": [], "deep": [], "cpu": []}
    depth = None  # the deep cut's MoE layers once the first deep part found it (0: none fits)

    def deep():
        nonlocal depth
        if depth is None:
            got = deep_residual_probe(topo, cost, device, dtype, **args)
            depth = 0 if got is None else got[0].n_moe_layers
            return got
        return (
            probe_if_it_fits(
                device, lambda: full_residency_probe(topo, cost, device, dtype, moe_layers=depth, **args)
            )
            if depth
            else None
        )

    runs = {
        "resident": lambda: full_residency_probe(topo, cost, device, dtype, **args),
        "deep": deep,
        "cpu": lambda: cpu_call_probe(topo, cost, device, dtype, **args),
    }
    order = list(runs)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            got = runs[name]()
            if got is not None:
                parts[name].append(got)
    return CutProbes(
        resident=pooled_probe(parts["resident"]),
        deep=pooled_probe(parts["deep"]) if parts["deep"] else None,
        cpu=pooled_probe(parts["cpu"]),
    )


def pooled_probe(parts: list):
    """One probe result from parts replaying the same forwards on the same cut: the first part's result with every
    part's measured rows (its last item) together."""
    return (*parts[0][:-1], pd.concat([p[-1] for p in parts], ignore_index=True))


def forward_excess_seconds(probe, cost) -> float:
    """Median over the probe's measured forwards of what each took beyond the model's charge: its measured time, less
    its decisions, less the simulator's own time for the same forward under full residency with ``cost`` (which
    charges the routing wait and bookkeeping already measured) and no decision time."""
    from dllm_offload_sim.policies.base import PolicyContext
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.sim.engine import Simulation

    cut, fwds, pf = probe
    cost = cost.with_policy_time(0.0)
    sim = Simulation(
        cut, ResidencyDriver(FullResidencyPolicy(), PolicyContext.of(cut, cut.n_experts, cost)), cost
    )
    sim.run(fwds, lambda b: None)
    model = dict(zip(*(sim.metrics.per_forward()[c] for c in ("forward", "duration_s"))))
    spent = pf.duration_s - pf.policy_s
    excess = [s - model[f] for f, s in zip(pf.forward, spent) if f in model]
    return float(np.median(excess)) if excess else 0.0


def residual_split(shallow, deep, cost) -> tuple[float, float]:
    """(per MoE layer, per forward) of what a resident forward takes beyond the model's charge (module docstring),
    from two :func:`full_residency_probe` results on cuts of different depths: the excess per forward is a line in
    the number of MoE layers, whose slope is the per-layer part and whose intercept the per-forward part (the replay's
    own work at a forward's start and end). Each part >= 0 (the terms never credit time back). Without a ``deep``
    probe (a model of two MoE layers or fewer) the whole excess is per layer, as profiles before the split held it."""
    e1, n1 = forward_excess_seconds(shallow, cost), shallow[0].n_moe_layers
    if deep is None:
        return max(e1 / n1, 0.0), 0.0
    e2, n2 = forward_excess_seconds(deep, cost), deep[0].n_moe_layers
    if n2 <= n1:
        raise ValueError(f"residual_split: the deep probe's cut ({n2} MoE layers) must be deeper than {n1}")
    per_layer = max((e2 - e1) / (n2 - n1), 0.0)
    return per_layer, max(e1 - n1 * per_layer, 0.0)


def cpu_call_probe(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    tokens: int = 16,
    kv_len: int = 256,
):
    """Random decode routing replayed on a two-MoE-layer cut with every miss on the CPU (~``CPU_PROBE_EXPERTS`` per
    layer): (the forwards, the resident experts per layer, the replay's measured rows), for :func:`cpu_call_seconds`
    and :func:`cpu_issue_seconds`."""
    from dllm_offload_sim.policies.base import LayerDecision, Policy

    class CpuMissProbe(Policy):
        """Profiler probe: experts ``0 .. cache-1`` of every layer stay resident, every miss runs on the CPU."""

        name = "cpu_miss_probe"

        def initial_residency(self):
            return [set(range(self.ctx.cache)) for _ in range(self.ctx.n_layers)]

        def decide(self, view):
            return LayerDecision(to_gpu=[], to_cpu=view.missed.tolist(), retain=view.resident)

    cut = _two_moe_layer_cut(topo)
    E, k = cut.n_experts, cut.top_k
    # chance that uniform top-k routing of ``tokens`` rows hits an expert
    p_active = 1.0 - (1.0 - k / E) ** tokens
    cache = int(np.clip(E - round(CPU_PROBE_EXPERTS / p_active), 1, E - 1))
    fwds = synthetic_decode_forwards(cut, forwards, tokens, kv_len, warmup, seed=1)
    return fwds, cache, _replay_measured(cut, CpuMissProbe(), cache, cost, fwds, device, dtype)


def _cpu_calls(probe):
    """Per measured forward of ``probe``: (its replay row, the tokens of each CPU expert per layer that runs one)."""
    fwds, cache, pf = probe
    for f in fwds:
        if not f.measured:
            continue
        row = pf[pf.forward == f.index]
        missed = [m[m > 0] for m in (f.counts[j][cache:] for j in range(len(f.counts)))]
        missed = [m for m in missed if len(m)]
        if not row.empty and missed:
            yield row, missed


def cpu_call_seconds(probe, cost) -> float:
    """Median over the probe's measured forwards of the replay's CPU-call cost beyond the profile's (module
    docstring): the reference engine's job building and compute per call beyond the curve and fixed cost, >= 0 (the
    native engine runs outside Python and records neither: 0)."""
    excess = []
    for row, missed in _cpu_calls(probe):
        charged = sum(
            cost.cpu_call_overhead_s + sum(cost.cpu_call_costs([int(t) for t in m])) for m in missed
        )
        spent = float(row.cpu_jobs_s.iloc[0] + row.cpu_compute_s.iloc[0])
        excess.append((spent - charged) / len(missed))
    return max(float(np.median(excess)), 0.0) if excess else 0.0


def grouped_issue_per_call(rows) -> float:
    """Median over a replay's measured ``rows`` of its host time per grouped call issued (NaN where it issued none),
    over the forwards whose every call replayed its captured graph where there are such: a call whose experts' slots
    span two blocks runs eagerly, at several times the host time (a probe whose arena had to shrink its blocks' spill
    areas to fit the device makes them; a validation run rarely does), and is not the step this term charges."""
    graphed = rows[rows.eager_calls == 0] if "eager_calls" in rows else rows
    if len(graphed):
        rows = graphed
    per = (rows.grouped_issue_s / rows.grouped_calls.where(rows.grouped_calls > 0)).dropna()
    return float(per.median()) if len(per) else float("nan")


def beside_engine_terms(resident_probe, cpu_probe, grouped_issue_s: float) -> dict:
    """``bookkeeping_cpu_s`` and ``grouped_issue_cpu_s`` (module docstring) from :func:`full_residency_probe`'s and
    :func:`cpu_call_probe`'s results on the same cut and the whole stack's ``grouped_issue_s``; a term the probes
    cannot give (no grouped call in either) is left out, and the simulator charges it as without the engine."""
    cut = resident_probe[0]
    rows = cpu_probe[2]
    out = {"bookkeeping_cpu_s": float(rows.bookkeeping_s.median()) / cut.n_moe_layers}
    alone, beside = grouped_issue_per_call(resident_probe[2]), grouped_issue_per_call(rows)
    if alone > 0 and beside == beside:
        out["grouped_issue_cpu_s"] = grouped_issue_s * beside / alone
    return out


def cpu_issue_seconds(probe) -> float:
    """Median over the probe's measured forwards of the host time the replay spent submitting a CPU call (per call):
    the runtime's thread submits a layer's CPU call before it issues the layer's copies and grouped calls."""
    per_call = [float(row.cpu_issue_s.iloc[0]) / len(missed) for row, missed in _cpu_calls(probe)]
    return float(np.median(per_call)) if per_call else 0.0


def copy_contention_slowdowns(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    host=None,
    reps: int = 15,
    warmup: int = 3,
    idle_s: float = 2e-3,
) -> dict:
    """``cpu_slowdown_beside_copies`` and ``copies_slowdown_beside_cpu`` (module docstring), each >= 0; 0 each on a
    CPU device (no copies)."""
    from dllm_offload_sim.runtime.copy_engine import ExpertCopier
    from dllm_offload_sim.runtime.host_experts import HostExperts
    from dllm_offload_sim.runtime.cpu_engine import profiled_cpu_engine
    from dllm_offload_sim.runtime.slot_pool import SlotPool

    dev = torch.device(device)
    if dev.type != "cuda":
        return {"cpu_slowdown_beside_copies": 0.0, "copies_slowdown_beside_cpu": 0.0}
    E, n = topo.n_experts, max(1, min(CONTENTION_EXPERTS, topo.n_experts // 2))
    call_s = cost.cpu_dispatch_seconds(n) + sum(cost.cpu_call_costs([1] * n))  # the profile's call, alone
    h2d = cost.expert_h2d_seconds()
    long_copies = max(2, int(np.ceil(CONTENTION_COVER * call_s / h2d)))  # outlast the call
    short_copies = max(1, int(call_s / (CONTENTION_COVER * h2d)))  # the call outlasts them
    host = host or HostExperts(topo, n_real_layers=1, dtype=dtype, pin=True)
    pool = SlotPool(long_copies, topo.hidden, topo.moe_intermediate, dtype=dtype, device=dev)
    copier = ExpertCopier(host, pool, dev)
    engine = profiled_cpu_engine(cost, host, dev, max_tokens=n)
    # a stream-ordered call's compute timed on the GPU's clock, without its result's copy
    engine.stage_events = True
    x = torch.randn((n, topo.hidden), dtype=dtype, device=dev)
    w = np.ones((n, 1), np.float32)
    out = torch.zeros((n, topo.hidden), dtype=torch.float32, device=dev)
    calls = iter(range(10**9))

    def once(cpu: bool, copies: int) -> ContendedTimes:
        base = next(calls) * (n + copies)  # different experts each call: weights from DRAM
        experts = (base + np.arange(n)) % E
        torch.cuda.synchronize(dev)
        time.sleep(idle_s)
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        handle = engine.submit(0, x, experts.reshape(n, 1), w, experts.tolist()) if cpu else None
        if copies:  # issued after the call's submission, as the runtime issues a layer's copies
            c0.record(copier.stream)
            copier.demand(0, [int(e) for e in (base + n + np.arange(copies)) % E], list(range(copies)))
            c1.record(copier.stream)
        t1 = time.perf_counter()
        ct = engine.finish(handle, out) if handle is not None else None
        torch.cuda.synchronize(dev)
        cpu_s = (
            float("nan")
            if ct is None
            else ct.path[0].elapsed_time(ct.computed) / 1e3
            if ct.path is not None and ct.computed is not None
            else cpu_path_seconds(ct, t0, t1)
        )
        return ContendedTimes(cpu_s, c0.elapsed_time(c1) / 1e3 if copies else float("nan"))

    try:
        cpu_alone, cpu_beside = alone_and_beside(lambda k: once(True, k).cpu_s, long_copies, reps, warmup)
        copies_alone, copies_beside = alone_and_beside(
            lambda on: once(bool(on), short_copies).copies_s, 1, reps, warmup
        )
    finally:
        engine.close()
    return {
        "cpu_slowdown_beside_copies": slowdown(cpu_alone, cpu_beside),
        "copies_slowdown_beside_cpu": slowdown(copies_alone, copies_beside),
    }


@dataclasses.dataclass(frozen=True)
class ContendedTimes:
    """One round of :func:`copy_contention_slowdowns`: the CPU call's compute and the copies' time (NaN: not run)."""

    cpu_s: float
    copies_s: float


def slowdown(alone_s: float, beside_s: float) -> float:
    """How much slower something ran beside other work than alone, as a fraction (beside / alone - 1), >= 0."""
    return max(beside_s / alone_s - 1.0, 0.0) if alone_s > 0 else 0.0


def alone_and_beside(once, beside_arg, reps: int, warmup: int) -> tuple[float, float]:
    """The median of ``once(0)`` (a call alone) and of ``once(beside_arg)`` (the same call with work beside it), run
    round-robin ``reps`` times after ``warmup`` untimed rounds, so that a shared host's moves fall on both alike."""
    for _ in range(warmup):
        once(0), once(beside_arg)
    alone, beside = [], []
    for _ in range(reps):
        alone.append(once(0))
        beside.append(once(beside_arg))
    return statistics.median(alone), statistics.median(beside)


def cpu_path_seconds(times, submitted_s: float, finishing_s: float) -> float:
    """A CPU call's own path: a stream-ordered call's on the GPU's clock (its timing events), otherwise from its
    submission (``submitted_s``, host clock) to the host holding its result (``finishing_s``, when the host asked for
    it, plus the time it blocked)."""
    if times.path is not None:
        return times.path[0].elapsed_time(times.path[1]) / 1e3
    return finishing_s - submitted_s + times.blocked_s


def cpu_busy_gpu_seconds(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    host=None,
    reps: int = 15,
    warmup: int = 3,
    idle_s: float = 2e-3,
) -> float:
    """How much longer a CPU call's path takes while the GPU computes beside it for the call's whole length (module
    docstring), >= 0; 0 on a CPU device (no GPU to be busy)."""
    from dllm_offload_sim.runtime.host_experts import HostExperts
    from dllm_offload_sim.runtime.cpu_engine import profiled_cpu_engine

    dev = torch.device(device)
    if dev.type != "cuda":
        return 0.0
    E, k, T = topo.n_experts, topo.top_k, CPU_BUSY_ROWS
    host = host or HostExperts(topo, n_real_layers=1, dtype=dtype, pin=True)
    engine = profiled_cpu_engine(cost, host, dev, max_tokens=T)
    rng = np.random.default_rng(4)
    x = torch.randn((T, topo.hidden), dtype=dtype, device=dev)
    out = torch.zeros((T, topo.hidden), dtype=torch.float32, device=dev)
    w = np.full((T, k), 1.0 / k, np.float32)
    a = torch.randn((CPU_BUSY_MATMUL, CPU_BUSY_MATMUL), dtype=torch.bfloat16, device=dev)
    c = torch.empty_like(a)

    def once(matmuls: int) -> float:
        ids = np.argsort(rng.random((T, E)), axis=1)[:, :k].astype(
            np.int64
        )  # the replay's layout: T rows, top-k
        on_cpu = np.unique(ids)[:CPU_BUSY_EXPERTS].tolist()
        time.sleep(idle_s)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        handle = engine.submit(0, x, ids, w, on_cpu)
        for _ in range(matmuls):  # issued after the call, as the runtime issues a layer's GPU path
            torch.mm(a, a, out=c)
        t1 = time.perf_counter()
        ct = engine.finish(handle, out)
        torch.cuda.synchronize(dev)
        return cpu_path_seconds(ct, t0, t1)

    def matmul_seconds() -> float:
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s0.record()
        for _ in range(4):
            torch.mm(a, a, out=c)
        s1.record()
        s1.synchronize()
        return s0.elapsed_time(s1) / 1e3 / 4

    try:
        for _ in range(warmup):
            once(0)
        alone0 = statistics.median(once(0) for _ in range(3))
        # outlasts the call
        n = int(np.ceil(1.25 * alone0 / statistics.median(matmul_seconds() for _ in range(3)))) + 1
        alone, beside = alone_and_beside(once, n, reps, warmup)
    finally:
        engine.close()
    return max(beside - alone, 0.0)


def prefetch_start_seconds(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    tokens: int = 16,
    kv_len: int = 256,
) -> float:
    """The runtime's host time per prefetch it starts (module docstring): the median over the probe's measured
    forwards of the replay's prefetch host time per prefetch copied (0 where none was copied)."""
    from dllm_offload_sim.policies.base import LayerDecision, Policy, PolicyContext
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.runtime.replay import ReplayEngine
    from dllm_offload_sim.sim.engine import Simulation

    class PrefetchProbe(Policy):
        """Profiler probe: misses copied on demand, the active experts kept first; at the first MoE layer, prefetches
        of the second layer's highest experts (those already resident are passed over), each evicting the highest
        resident."""

        name = "prefetch_probe"
        prefetches = True

        def decide(self, view):
            E = self.ctx.n_experts
            plan = (
                [(1, e) for e in range(E - 1, max(E - 1 - PREFETCH_PROBE_EXPERTS, -1), -1)]
                if view.layer == 0
                else None
            )
            active = set(view.active.tolist())
            keep = sorted(set(view.resident) | active, key=lambda e: (e not in active, e))[: view.capacity]
            return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=set(keep), prefetch=plan)

        def prefetch_victim(self, layer, expert, resident, protected):
            free = sorted(set(resident) - set(protected))
            return free[-1] if free else None

    cut = _two_moe_layer_cut(topo)
    cache = cut.n_experts // 2
    fwds = synthetic_decode_forwards(cut, forwards, tokens, kv_len, warmup, seed=3)
    # the simulator's schedule, then the replay that follows it (a driver each)
    sim = Simulation(cut, ResidencyDriver(PrefetchProbe(), PolicyContext.of(cut, cache, cost)), cost)
    sim.schedule = []
    sim.run(fwds, lambda b: None)
    drv = ResidencyDriver(PrefetchProbe(), PolicyContext.of(cut, cache, cost))
    eng = ReplayEngine(cut, drv, cost, device=device, dtype=dtype, schedule=sim.schedule)
    try:
        pf = eng.run(fwds, lambda b: None)
    finally:
        eng.close()
    pf = pf[pf.measured & (pf.prefetch_copies > 0)]
    per = (pf.prefetch_issue_s / pf.prefetch_copies).tolist()
    return float(np.median(per)) if per else 0.0


def whole_stack_probe(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    tokens: int = 16,
    kv_len: int = 256,
):
    """Random decode routing replayed on the whole layer stack under ``POLICY_PROBE`` at half the experts (fewer where
    the device cannot hold that arena): (the forwards, the cache, the replay's measured rows), for
    :func:`policy_time_factor` and :func:`grouped_issue_seconds`."""
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    cache = probe_cache(topo, topo.n_experts // 2, device)
    fwds = synthetic_decode_forwards(topo, forwards, tokens, kv_len, warmup, seed=2)
    return (
        fwds,
        cache,
        _replay_measured(topo, make_policy(policy_config(POLICY_PROBE)), cache, cost, fwds, device, dtype),
    )


def grouped_issue_seconds(probe) -> float:
    """Median over the probe's measured forwards of the host time the replay spent issuing a grouped expert call (per
    call: the routing's upload and the graph's launch), in the whole stack's running replay; ``probe``:
    :func:`whole_stack_probe`'s result."""
    per = grouped_issue_per_call(probe[2])
    return per if per == per else 0.0


def policy_time_factor(
    topo: ModelTopology,
    cost,
    device,
    dtype=torch.bfloat16,
    forwards: int = 24,
    warmup: int = 4,
    tokens: int = 16,
    kv_len: int = 256,
    probe=None,
) -> float:
    """The replay's decision time over a simulation's for the same decisions (module docstring); ``probe``: a
    :func:`whole_stack_probe` of the same forwards to reuse."""
    from dllm_offload_sim.policies.base import PolicyContext
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.sim.engine import Simulation
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    fwds, cache, pf = probe or whole_stack_probe(topo, cost, device, dtype, forwards, warmup, tokens, kv_len)
    sim_s = []
    for _ in range(2):  # the first warms the policy's code; the second is timed
        drv = ResidencyDriver(make_policy(policy_config(POLICY_PROBE)), PolicyContext.of(topo, cache, cost))
        Simulation(topo, drv, cost).run(fwds, lambda b: None)
        sim_s.append(drv.policy_wall_s / len(fwds))
    return decision_time_ratio(float(pf.policy_s.mean()), sim_s[-1])


def probe_cache(topo: ModelTopology, want: int, device) -> int:
    """``want`` slots per MoE layer, or fewer where the replay's arena for ``want`` would exceed its share of the
    device's free memory: the largest cache whose arena fits with every block's full spill area (``n_experts`` slots
    for the copies a layer makes beyond its home, so that every grouped call replays its captured graph), at least 1.
    LLaDA2.0-flash at half its experts needs 99 GiB, more than an 80 GB card holds; at the largest cache that fits at
    all, the arena keeps no spill area, and every layer that copies calls its experts eagerly, at several times the
    host time of the call the runs make."""
    from dllm_offload_sim.runtime.arena import ARENA_MEMORY_SHARE, free_device_bytes
    from dllm_offload_sim.runtime.grouped import MAX_GROUPS
    from dllm_offload_sim.runtime.slot_pool import block_layout

    L, E = topo.n_moe_layers, topo.n_experts
    budget = ARENA_MEMORY_SHARE * free_device_bytes(device) / topo.expert_bytes  # slots
    spill = min(E, MAX_GROUPS - 1)
    for cache in range(min(want, MAX_GROUPS - spill), 0, -1):
        if block_layout(L, cache, spill, MAX_GROUPS, E)[1] <= budget:
            return cache
    return 1


def decision_time_ratio(replay_s_per_forward: float, simulated_s_per_forward: float) -> float:
    """The replay's decision time per forward over the simulation's for the same decisions (1 where the simulation
    measured none)."""
    if simulated_s_per_forward <= 0 or not np.isfinite(replay_s_per_forward):
        return 1.0
    return max(replay_s_per_forward, 0.0) / simulated_s_per_forward
