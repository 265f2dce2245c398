"""``simulate``: one policy, one cache size, one cost model, one trace -> summary and tables."""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass, fields

import numpy as np
import pandas as pd

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.policies.base import Policy, PolicyContext, PolicyError
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.schedule.batch import ActivationOracle, RequestSource, batched_forwards, replay_order
from dllm_offload_sim.schedule.knowledge import combine_knowledge, request_profile
from dllm_offload_sim.schedule.summary import summarize
from dllm_offload_sim.sim.closed_form import ExpertCallsTable
from dllm_offload_sim.sim.engine import LayerTimes, Simulation
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import RequestArrays
from dllm_offload_sim.traces.shipped import trace_label
from dllm_offload_sim.traces.topology import ModelTopology
from dllm_offload_sim.wiring.build import int_field
from dllm_offload_sim.wiring.errors import ConfigError
from dllm_offload_sim.wiring.spec import SimSettings


# a trace of at most this many routing rows (about 50 MB of routing arrays at top-8) is read whole before a run
READ_WHOLE_ROWS = 1_000_000


@dataclass
class SimResult:
    """What one simulation returns: a summary row and the per-forward and per-layer tables."""

    summary: dict
    per_forward: pd.DataFrame
    per_layer: pd.DataFrame
    schedule: list | None = None  # with record_schedule: the residency event log (sim/engine.py)
    # with record_layers: one row per MoE layer executed (sim.engine.LayerTimes)
    layers: pd.DataFrame | None = None


def check_topology(trace_topo: ModelTopology, model_topo: ModelTopology | None, where: str) -> None:
    if model_topo is None:
        return
    for f in ("n_experts", "top_k", "moe_layers"):
        a, b = getattr(trace_topo, f), getattr(model_topo, f)
        if a != b:
            raise ConfigError(
                f"{where}: trace topology {trace_topo.name} has {f}={list(a) if f == 'moe_layers' else a} "
                f"but model {model_topo.name} has {list(b) if f == 'moe_layers' else b}"
            )


def check_inputs(
    trace: Trace,
    cache,
    cost: CostModel,
    ids: list[int],
    settings: SimSettings,
    model: ModelTopology | None = None,
) -> None:
    """Raise :class:`ConfigError` for a run that cannot hold on ``trace``, before anything runs (``settings`` checked
    its own fields when it was made)."""
    topo = trace.topology
    check_topology(topo, model, str(trace.path))
    batch_size, warmup_requests = settings.batch_size, settings.warmup_requests
    int_field("cache", int(cache) if isinstance(cache, np.integer) else cache, 0)
    if cache > topo.n_experts:
        raise ConfigError(f"cache={cache} exceeds the {topo.n_experts} experts per MoE layer of {topo.name}")
    if cost.expert_bytes != topo.expert_bytes:
        raise ConfigError(
            f"profile '{cost.profile.name}' is for experts of {cost.expert_bytes} bytes but trace "
            f"{trace.path} has {topo.name} experts of {topo.expert_bytes} bytes; choose the matching "
            f"profile (hw.profile)"
        )
    missing = sorted(set(ids) - set(trace.request_ids))
    if missing:
        raise ConfigError(
            f"trace {trace.path} has no requests {missing[:5]}; it has {trace.request_ids[:10]}"
        )
    if not ids:
        raise ConfigError(f"no requests to replay from {trace.path}")
    dup = sorted({r for r in ids if ids.count(r) > 1})
    if dup:
        raise ConfigError(f"trace.requests lists {dup} more than once; each request is replayed once")
    if batch_size > len(ids):
        raise ConfigError(
            f"sim.batch_size={batch_size} exceeds the {len(ids)} requests replayed from {trace.path}"
        )
    if warmup_requests < 0 or warmup_requests >= len(ids):
        raise ConfigError(
            f"sim.warmup_requests={warmup_requests} must leave at least one of the {len(ids)} "
            f"requests measured"
        )
    if not any(b0 >= warmup_requests for b0 in range(0, len(ids), batch_size)):
        raise ConfigError(
            f"sim.warmup_requests={warmup_requests} with sim.batch_size={batch_size} measures nothing: "
            f"a batch is measured only if it starts at or after request {warmup_requests}, and the "
            f"{len(ids)} requests form batches starting at {list(range(0, len(ids), batch_size))[:6]}"
        )


def simulate(
    trace: Trace | str,
    policy: Policy,
    cache: int,
    cost: CostModel,
    batch_size: int = 1,
    requests: list[int] | None = None,
    warmup_requests: int = 0,
    cpu_workers: int = 1,
    seed: int = 0,
    model: ModelTopology | None = None,
    loaded: list[RequestArrays] | None = None,
    knowledge: dict | None = None,  # request id -> schedule.knowledge.RequestProfile, shared by runs
    forwards_cache: dict | None = None,
    record_schedule: bool = False,
    decision_cost: CostModel | None = None,
    closed_form: bool = True,
    dummy_warmup: bool = False,
    record_layers: bool = False,
    calls: ExpertCallsTable | None = None,
) -> SimResult:
    """Replay ``trace`` (or its ``requests``) under ``policy`` with ``cache`` slots per MoE layer.

    ``decision_cost``: the profile whose costs the policy decides with (its ``CostHints``), where that is
    not the one the simulation is timed with (``cost``): re-predicting a validated run with another
    profile while its policy decides as it did on the GPU (``dllm-repredict``).

    ``knowledge`` and ``forwards_cache``: dicts a caller shares between runs on one trace (``sim.app.run_group``):
    the requests' offline profiles, and, where every request replayed is in ``loaded``, the batched forwards (and the
    future of a clairvoyant policy) for each (requests, batch size, warm-up) they are made for; neither holds a
    result, and forwards are not changed by a run.

    ``calls``: the layers' grouped GPU calls under ``cost`` (``sim.closed_form.ExpertCallsTable``), shared by the
    runs a caller makes with one cost model; a table of this run's own without it.

    ``record_layers``: also return when each MoE layer's parts happened (``SimResult.layers``; the validator's
    per-layer timeline).

    ``dummy_warmup``: the paper's protocol, the same for every policy: the first batch is replayed once,
    unmeasured, before the measured ones, so every policy starts from a cache it warmed itself (a static
    placement included) rather than cold or for free. ``closed_form=False`` times every layer as events (see :class:`sim.engine.Simulation`); same results.

    The forwards are streamed: each batch's requests are read from the trace when the batch begins (from
    ``loaded``, requests already read, where they are there) and dropped after it, so memory does not grow with the
    number of requests (a policy that reads the future keeps its ``[forwards, layers, experts]`` table, and a
    policy that matches other requests' expert maps keeps those).

    Knowledge for offline-profiled policies (popularity, EAMs, expert maps) comes from the replayed
    requests that are *not* in the batch being replayed. Deterministic in its inputs; only the
    wall-time columns (``sim_wall_s``, ``policy_*``) vary between runs.
    """
    wall0 = time.perf_counter()
    if not isinstance(trace, Trace):
        trace = Trace.open(trace)
    topo = trace.topology
    ids = trace.request_ids if requests is None else [int(r) for r in requests]
    settings = SimSettings(batch_size, warmup_requests, dummy_warmup, cpu_workers, seed)
    check_inputs(trace, cache, cost, ids, settings, model=model)
    # the requests are read from the trace as their batch begins (those in ``loaded`` are taken from it); a small
    # trace is read whole first instead, since knowledge and the run would each read every request
    if loaded is None and trace.routing_rows <= READ_WHOLE_ROWS:
        loaded = [trace.request(r) for r in dict.fromkeys(ids)]
    by_id = {r.request_id: r for r in loaded} if loaded is not None else {}
    know = knowledge if knowledge is not None else {}

    ctx = PolicyContext.of(
        topo,
        cache,
        decision_cost if decision_cost is not None else cost,
        cpu_workers,
        trace.block_length,
        seed,
    )
    try:
        driver = ResidencyDriver(policy, ctx)
    except PolicyError as e:
        raise ConfigError(str(e)) from None
    order, warmup_requests = replay_order(ids, batch_size, warmup_requests, dummy_warmup)
    reqs = RequestSource(order, trace.request, by_id)
    batch_members = {}
    for i, rid in enumerate(order):
        batch_members.setdefault(i // batch_size, set()).add(rid)

    def profiled(rids: list[int]) -> list:  # each request profiled once, on first use, and kept in ``know``
        for rid in rids:
            if rid not in know:
                know[rid] = request_profile(reqs.request(rid), topo)
        return [know[rid] for rid in rids]

    def knowledge_for_batch(b):  # a one-request run has nothing to profile
        others = [rid for rid in ids if rid not in batch_members[b]]
        return combine_knowledge(profiled(others), reqs.request, topo)

    if (
        len(ids) > batch_size
    ):  # every request is another batch's knowledge: profile each before any batch runs,
        profiled(ids)  # one request read at a time (not beside the first batch's)

    sim = Simulation(topo, driver, cost, cpu_workers, closed_form=closed_form, calls=calls)
    if record_schedule:
        sim.schedule = []
    if record_layers:
        sim.layer_times = []
    oracle, key = None, (tuple(order), batch_size, warmup_requests)
    if forwards_cache is not None and all(rid in by_id for rid in order):  # in memory: made once for all runs
        forwards = forwards_cache.get(key)
        if forwards is None:
            forwards = forwards_cache[key] = list(
                batched_forwards(reqs, batch_size, topo.n_experts, warmup_requests)
            )
        if driver.needs_future:
            oracle = forwards_cache.get(key + ("oracle",))
            if oracle is None:
                oracle = forwards_cache[key + ("oracle",)] = ActivationOracle(forwards)
    else:
        if driver.needs_future:  # the future, from a pass of its own over the forwards
            oracle = ActivationOracle(batched_forwards(reqs, batch_size, topo.n_experts, warmup_requests))
        forwards = batched_forwards(reqs, batch_size, topo.n_experts, warmup_requests)  # streamed
    batch_starts = sim.run(forwards, knowledge_for_batch, oracle)
    pf = sim.metrics.per_forward()
    summary = _summary(sim, pf, batch_starts, policy, cache, cost, trace, batch_size)
    summary["sim_wall_s"] = time.perf_counter() - wall0
    layers = int(pf.shape[0]) * topo.n_moe_layers
    summary["sim_layer_execs_per_s"] = (
        layers / summary["sim_wall_s"] if summary["sim_wall_s"] > 0 else float("nan")
    )
    layer_rows = None
    if record_layers:
        layer_rows = pd.DataFrame(
            [astuple(t) for t in sim.layer_times], columns=[f.name for f in fields(LayerTimes)]
        )
    return SimResult(summary, pf, sim.metrics.per_layer(topo.moe_layers), sim.schedule, layer_rows)


def _summary(sim, pf: pd.DataFrame, batch_starts, policy, cache, cost, trace, batch_size) -> dict:
    m = sim.metrics
    totals = summarize(pf)
    # TTFT per request: end of its first forward that decodes a token, from its batch's start
    fwd, firsts = pf.forward.to_numpy(), np.array([t.forward for t in m.first_tokens], np.int64)
    at = np.searchsorted(fwd, firsts)  # forwards run in index order
    if len(at) and not np.array_equal(fwd[np.minimum(at, len(fwd) - 1)], firsts):
        raise RuntimeError("simulate: the per-forward table is not in forward order")
    ends = (pf.start_s.to_numpy() + pf.duration_s.to_numpy())[at]
    ttft = [float(end) - batch_starts[t.batch] for end, t in zip(ends, m.first_tokens)]
    active, hits = sum(m.active), sum(m.hits)
    util = sum(m.util_sum) / sum(m.util_n) if sum(m.util_n) else float("nan")
    h2d_count = int(sum(m.demand)) + m.prefetch.copies + m.placement_copies
    return {
        "policy": policy.name,
        "cache": int(cache),
        "pcie_gbps": cost.pcie_gbps,
        "tpot_ms": totals.tpot_ms,
        "ttft_ms": 1e3 * float(np.mean(ttft)) if ttft else float("nan"),
        "cache_util": float(util),
        "hit_rate": float(hits / active) if active else float("nan"),
        "h2d_gb": (m.demand_bytes + m.prefetch.bytes + m.placement_copies * cost.expert_bytes) / 1e9,
        "h2d_count": h2d_count,
        "demand_copies": int(sum(m.demand)),
        "prefetch_copies": int(m.prefetch.copies),
        "placement_copies": int(m.placement_copies),
        "prefetch_dropped": int(m.prefetch.dropped),
        "prefetch_wasted": int(m.prefetch.wasted),
        "late_prefetch_hits": int(m.late_prefetch_hits),
        "cpu_experts": int(sum(m.cpu)),
        "effective_transfer_ratio": m.effective / m.transfers_decode if m.transfers_decode else float("nan"),
        "activations": int(active),
        "hits": int(hits),
        "forwards": totals.forwards,
        "decode_forwards": totals.decode_forwards,
        "decoded_tokens": totals.decoded_tokens,
        "decode_time_s": totals.decode_time_s,
        "tokens_per_forward": totals.decoded_tokens / totals.decode_forwards
        if totals.decode_forwards
        else float("nan"),
        "policy_ms_per_forward": 1e3 * m.policy_wall_s / max(len(pf), 1),
        "policy_us_per_layer": 1e6 * m.policy_wall_s / max(m.policy_calls, 1),
        "policy_hooks_us_per_forward": 1e6 * m.forward_hooks_wall_s / max(len(pf), 1),
        "model": trace.topology.name,
        "trace": trace_label(trace.path),
        "batch_size": int(batch_size),
        "profile": cost.profile.name,
        "profile_status": cost.profile.status,
    }
