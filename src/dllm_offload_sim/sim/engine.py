"""The discrete-event engine: one SimPy Environment replays batched forwards under a policy.

Resources mirror the GPU runtime:

* the GPU compute stream: the forward process below runs layers in order; per MoE layer it
  spends the non-expert time (attention, norms, gate, shared expert), then the layer's grouped expert
  calls (:class:`schedule.timeline.ExpertCalls`): the hits', and the copied experts' once their demand copies
  have landed, or one call over both;
* the H2D copy engine (:class:`sim.copy_engine.CopyEngine`): one copy at a time, demand batches before
  queued prefetches, prefetches for a layer already reached in this forward dropped, a prefetch into a
  full layer evicting the victim the policy names (or skipped);
* the CPU worker pool: missed experts the policy sends to the CPU, list-scheduled on
  ``cpu_workers`` workers after the activations are dispatched; they overlap with the GPU path. Their
  result goes back over the same copy engine as the layer's demand copies, so it lands no earlier than
  those copies plus its own transfer (``CostModel.cpu_result_seconds``). The CPU call and the layer's demand copies
  both read host memory, so while both run each is slower (``CostModel.cpu_and_copies``).

A layer ends when the GPU stream and the CPU are both done with it. Events are per layer and per
copied expert (demand copies of one layer form one job), never per byte. The policy is driven through
:class:`policies.residency.ResidencyDriver`, which owns the residency; this module only times.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import simpy

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.policies.base import ForwardInfo
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.schedule.batch import ActivationOracle, BatchedForward
from dllm_offload_sim.schedule.events import ForwardBegin, LayerEnd, LayerReach, ScheduleEvent
from dllm_offload_sim.sim.closed_form import (
    COPIES_SLOWED,
    CPU_PATH,
    CPU_SLOWED,
    ExpertCallsTable,
    time_forward,
)
from dllm_offload_sim.sim.copy_engine import CopyEngine, CpuCall, PrefetchCounts
from dllm_offload_sim.sim.fused import fused_forward_of
from dllm_offload_sim.sim.metrics import ForwardRecord, RunMetrics
from dllm_offload_sim.schedule.timeline import cpu_makespan, layer_span
from dllm_offload_sim.traces.schema import PREFILL
from dllm_offload_sim.traces.topology import ModelTopology

# What a simulation computes from a config and its inputs (this engine and the cost model): a finished run stored
# under another version is recomputed rather than resumed. Bump it with every change that moves a result.
MODEL_VERSION = 3  # 3: the summary's tpot_bound_ms


@dataclass(slots=True)
class LayerTimes:
    """When one simulated MoE layer's parts happen, in seconds from its forward's start: ``gate`` (its routing, the
    policy's decision and the layer's fixed host costs charged), the CPU path's end (its result in the layer's output;
    NaN without CPU experts), the GPU path's end (hits' and copied experts' calls) and the layer's end (both paths
    joined); and two parts of those paths: the CPU experts computed (slowed while the layer's copies ran beside them,
    before their result's copy queues behind those copies; NaN without CPU experts) and the layer's demand copies
    landed (NaN without copies)."""

    forward: int
    layer: int
    gate_s: float
    cpu_end_s: float
    gpu_end_s: float
    end_s: float
    to_gpu: int
    to_cpu: int
    cpu_computed_s: float = float("nan")
    copies_end_s: float = float("nan")


@dataclass(slots=True)
class ForwardTimes:
    """Modelled seconds one forward's MoE layers would take had every expert been resident, and on the CPU path."""

    resident_expert_s: float = 0.0
    cpu_path_s: float = 0.0
    cpu_slowed_s: float = 0.0  # how much later CPU calls computed because demand copies ran beside them
    copies_slowed_s: float = 0.0  # how much later demand copies landed because a CPU call ran beside them


@dataclass(slots=True)
class LayerWork:
    """One MoE layer decided: its active experts, the policy's checked plan, its hits and routed (token, expert) pairs,
    its CPU experts' seconds after the gate (0 without), and the key of its grouped GPU calls
    (``ExpertCallsTable.calls``)."""

    active: np.ndarray
    plan: object
    n_hits: int
    total_tok: int
    cpu_s: float
    calls_key: tuple


class Simulation:
    """Replays a list of batched forwards under one policy (through its driver) and cost model.

    ``closed_form``: a layer that nothing can interleave with (copy engine idle, no prefetch planned) is timed
    in closed form and its time spent with the next timeout; False times every layer as events (the same
    ``layer_span`` arithmetic; a test holds the two equal). With ``closed_form`` and a policy that never prefetches,
    every layer is of that kind: each forward's layers are decided first and timed at once, compiled
    (:meth:`closed_form_only`, ``sim.closed_form``). ``calls``: the layers' grouped GPU calls, shareable between
    simulations of one cost model (a table of their own otherwise).
    """

    def __init__(
        self,
        topology: ModelTopology,
        driver: ResidencyDriver,
        cost: CostModel,
        cpu_workers: int = 1,
        closed_form: bool = True,
        calls: ExpertCallsTable | None = None,
    ):
        self.topo, self.driver, self.cost = topology, driver, cost
        self.cpu_workers = max(1, int(cpu_workers))
        self.closed_form = closed_form
        L = topology.n_moe_layers
        self.metrics = RunMetrics(L, cost.expert_bytes)
        # experts copied into each layer during the latest two decode forwards: [(forward, set), (forward, set)]
        self.copied = [[(-1, set()), (-1, set())] for _ in range(L)]
        self.decode_forward = False
        self.moe_index = {lid: j for j, lid in enumerate(topology.moe_layers)}
        # with record_schedule: every state change the policy's residency sees, in simulated-time order
        # (forward begins, layer reaches and ends, prefetch starts/skips/completions); the GPU replay
        # follows it so that prefetching policies see the same residency there (runtime/replay.py)
        self.schedule: list[ScheduleEvent] | None = None
        # with record_layers: one LayerTimes per MoE layer executed (validate's per-layer timeline)
        self.layer_times: list | None = None
        self._t_forward = 0.0  # the current forward's start
        if calls is not None and calls.cost is not cost:
            raise ValueError("Simulation: calls is a table of another cost model than cost")
        self.calls = calls if calls is not None else ExpertCallsTable(cost)  # the layers' grouped GPU calls
        self._dispatch_s = 0.0  # cost.cpu_dispatch_seconds of the current forward's tokens
        self._result_s = 0.0  # cost.cpu_result_seconds of the current forward's tokens
        self._cpu_costs = cost.cpu_call_costs  # CPU seconds of each expert of a layer's CPU call
        # the host submitting a layer's CPU call before it issues the GPU path
        self._cpu_issue_s = cost.cpu_issue_s
        # the previous MoE layer ran a CPU call (its next layer's bookkeeping runs slower)
        self._after_cpu = False
        self._prefetch_copies = 0  # prefetches that landed during the current forward

    def log(self, event: ScheduleEvent) -> None:
        if self.schedule is not None:
            self.schedule.append(event)

    def record_copies(self, j: int, forward: int, experts) -> None:
        """Remember experts copied into layer ``j`` during decode forward ``forward``."""
        slots = self.copied[j]
        if slots[1][0] != forward:
            slots[0] = slots[1]
            slots[1] = (forward, set())
        slots[1][1].update(experts)

    def _prefetch_landed(self, j: int, forward: int, e: int) -> None:
        if self.decode_forward:
            self.record_copies(j, forward, (e,))

    def _cpu_seconds(self, plan) -> tuple[float, int]:
        """How long after its activations are ready a layer's CPU experts are done, and their tokens."""
        c = plan.to_cpu
        if len(c) <= 8:  # a few CPU experts: look each up (cheaper than a dict of every miss)
            idx = plan.missed.index
            c_tok = [plan.missed_tokens[idx(e)] for e in c]
        else:
            c_tok = list(map(dict(zip(plan.missed, plan.missed_tokens)).__getitem__, c))
        return self._cpu_call_seconds(c_tok), sum(c_tok)

    def _cpu_call_seconds(self, c_tok: list) -> float:
        """How long after its activations are ready a CPU call over experts of ``c_tok`` tokens each is done."""
        return self._dispatch_s + cpu_makespan(self._cpu_costs(c_tok), self.cpu_workers)

    def _moe_layer(
        self,
        env,
        engine: CopyEngine,
        f: BatchedForward,
        info: ForwardInfo,
        j: int,
        ne: float,
        times: ForwardTimes,
    ):
        """One MoE layer: its non-expert time ``ne``, the policy's decision, its expert work."""
        drv = self.driver
        ne += self._pending
        self._pending = 0.0
        if self._after_cpu:
            ne += self.cost.bookkeeping_after_cpu_s
        # idle()
        fast = self.closed_form and engine.inflight is None and not engine.demand and not len(engine.prefetch)
        if not fast:
            yield env.timeout(ne)
        started = engine.take_started()  # the runtime's host starts them before it decides this layer
        extra = started * self.cost.prefetch_start_s
        if extra and not fast:
            yield env.timeout(extra)
        t_gate = env.now + (ne + extra if fast else 0.0)
        late = 0
        row = drv.mask[j]
        if not fast:
            engine.reach_layer(j)
            inf = engine.inflight
            if inf is not None and inf.layer == j and not row[inf.expert] and f.counts[j, inf.expert]:
                yield engine.landing()  # wait for the prefetch already on the wire
                late = int(row[inf.expert])
        else:
            engine.layer = j
        sched = self.schedule
        if sched is not None:
            sched.append(LayerReach(f.index, j))
        w = self._decide(f, info, j)
        plan, g, c = w.plan, w.plan.to_gpu, w.plan.to_cpu
        calls = self.calls.calls(w.calls_key)
        cpu_alone = t_gate + w.cpu_s if c else None
        self._after_cpu = bool(c)
        cost = self.cost
        if fast and plan.prefetch is None:  # nothing else runs: spent with the next timeout
            # the GPU path is issued after the CPU call's submission; the copies land as on an idle copy engine
            t_issue = t_gate + self._cpu_issue_s if c else t_gate
            landed, beside = calls.copies_land_when_idle(t_issue), None
            if c and g:
                beside = cost.cpu_and_copies(t_gate, cpu_alone, landed - calls.copies_s, landed)
                landed = beside.copies_end_s
            span = layer_span(
                calls, t_gate, t_issue, landed, cpu_alone, beside, self._result_s, cost.cpu_busy_gpu_s
            )
            self._pending = span.end_s - env.now
        else:
            if fast:
                yield env.timeout(ne)
            if c and self._cpu_issue_s > 0:  # the host submits the CPU call first
                yield env.timeout(self._cpu_issue_s)
            t_issue = env.now
            if g and calls.copies_wait_s > 0:
                yield env.timeout(calls.copies_wait_s)
            # demand copies queue ahead of any prefetch; beside the layer's CPU call both read host memory
            ev = engine.submit_demand(j, g, CpuCall(t_gate, cpu_alone) if c else None) if g else None
            if plan.prefetch is not None:  # the new plan starts now, overlapping this layer's compute
                engine.replace_prefetch(f.index, plan.prefetch)
            beside = (yield ev) if ev is not None else None
            landed = env.now
            span = layer_span(
                calls, t_gate, t_issue, landed, cpu_alone, beside, self._result_s, cost.cpu_busy_gpu_s
            )
            if env.now < span.end_s:
                yield env.timeout(span.end_s - env.now)
        times.cpu_path_s += span.cpu_compute_s
        times.cpu_path_s += span.cpu_after_copies_s
        times.cpu_path_s += span.cpu_beside_gpu_s
        times.cpu_slowed_s += span.cpu_slowed_s
        times.copies_slowed_s += span.copies_slowed_s

        if self.layer_times is not None:
            t0 = self._t_forward
            nan = float("nan")
            self.layer_times.append(
                LayerTimes(
                    f.index,
                    j,
                    t_gate - t0,
                    span.cpu_end_s - t0 if c else nan,
                    span.gpu_end_s - t0,
                    env.now + self._pending - t0,
                    len(g),
                    len(c),
                    span.cpu_computed_s - t0 if c else nan,
                    landed - t0 if g else nan,
                )
            )
        if sched is not None:
            sched.append(LayerEnd(f.index, j))
        self._account(f, j, w, engine.measuring, late, times)

    def _decide(self, f: BatchedForward, info: ForwardInfo, j: int) -> "LayerWork":
        """MoE layer ``j`` of forward ``f`` decided by the policy (through the driver), with what timing it needs."""
        active, tokens = f.routing(j)
        plan = self.driver.decide(info, j, f.ids_by_layer[j], f.weights_by_layer[j], active, tokens)
        n_hits = len(active) - len(plan.missed)
        total_tok = f.n_tokens * self.topo.top_k
        miss_tok = sum(plan.missed_tokens)
        cpu_s, c_tok = self._cpu_seconds(plan) if plan.to_cpu else (0.0, 0)
        key = (n_hits, total_tok - miss_tok, len(plan.to_gpu), miss_tok - c_tok, bool(plan.to_cpu))
        return LayerWork(active, plan, n_hits, total_tok, cpu_s, key)

    def _account(self, f: BatchedForward, j: int, w: "LayerWork", measured: bool, late: int, times) -> None:
        """MoE layer ``j`` of forward ``f`` ran: the residency it retains, the copies it made, its counters."""
        plan = w.plan
        g = plan.to_gpu
        decode = f.phase != PREFILL
        fi = f.index
        slots = self.copied[j]
        effective = 0
        if measured and decode:  # effective transfers: copied in the previous forward, hit now
            prev = slots[1][1] if slots[1][0] == fi - 1 else (slots[0][1] if slots[0][0] == fi - 1 else None)
            if prev and w.n_hits:
                effective = len(prev.intersection(w.active[~plan.is_miss].tolist()))
        self.driver.end_layer(j, plan)
        if decode:
            if slots[1][0] != fi:  # record_copies(j, fi, g), inlined
                slots[0] = slots[1]
                slots[1] = (fi, set(g))
            else:
                slots[1][1].update(g)
        if measured:
            self.metrics.late_prefetch_hits += late
        self._count_layer(
            j,
            times,
            decode=decode,
            measured=measured,
            n_active=len(w.active),
            n_hits=w.n_hits,
            capacity=plan.view.capacity,
            n_gpu=len(g),
            n_cpu=len(plan.to_cpu),
            effective=effective,
            total_tok=w.total_tok,
        )

    def _count_layer(
        self,
        j: int,
        times: ForwardTimes,
        *,
        decode: bool,
        measured: bool,
        n_active: int,
        n_hits: int,
        capacity: int,
        n_gpu: int,
        n_cpu: int,
        effective: int,
        total_tok: int,
    ) -> None:
        """MoE layer ``j`` ran with ``n_active`` experts (``total_tok`` routed pairs), ``n_hits`` of them resident, in a
        layer of ``capacity`` slots, ``n_gpu`` copied in and ``n_cpu`` run on the CPU, ``effective`` of its hits copied
        in the previous forward: the run's counters and the forward's resident-expert seconds (``times``)."""
        m = self.metrics
        if measured and decode:
            m.effective += effective
            m.transfers_decode += n_gpu
        if measured:
            m.layer(j, n_active, n_hits, capacity, n_gpu, n_cpu, decode)
        times.resident_expert_s += self.calls.gpu_call(n_active, total_tok)[0]

    def _begin_batch(self, f: BatchedForward, knowledge_for_batch) -> int:
        """Forward ``f`` starts a batch: the policy's placement for it; returns how many experts it newly placed (they
        are copied like any other expert, before the batch's first forward)."""
        drv = self.driver
        before = list(drv.resident)
        placed = drv.begin_batch(knowledge_for_batch(f.batch))
        n_new = sum(len(drv.resident[j] - before[j]) for j in placed)
        if n_new and f.measured:
            self.metrics.placement_copies += n_new
        return n_new

    def _begin_forward(self, f: BatchedForward) -> ForwardInfo:
        """What the policy is told of forward ``f`` as it begins; the forward's per-token CPU costs set."""
        self.decode_forward = f.phase != PREFILL
        self._dispatch_s = self.cost.cpu_dispatch_seconds(f.n_tokens)
        self._result_s = self.cost.cpu_result_seconds(f.n_tokens)
        return f.info()

    def _layer_seconds(self, f: BatchedForward) -> tuple[float, float]:
        """(a MoE layer's non-expert seconds, a dense layer's seconds) in forward ``f``."""
        cost = self.cost
        ne = cost.non_expert_seconds(f.n_tokens, f.kv_len) + cost.policy_per_layer_s + cost.layer_overhead_s
        return ne, cost.dense_layer_seconds(f.n_tokens, f.kv_len)

    def _end_forward(
        self,
        f: BatchedForward,
        info: ForwardInfo,
        t_start: float,
        end: float,
        ne: float,
        dense_s: float,
        times,
    ) -> None:
        """Forward ``f`` ran from ``t_start`` to ``end``: the policy's hook, then its record."""
        cost, topo = self.cost, self.topo
        n = self.driver.end_forward(info)
        nonexpert_s = (
            len(self.moe_index) * ne
            + (topo.n_layers - len(self.moe_index)) * dense_s
            + cost.per_forward_seconds(f.n_tokens)
            + cost.forward_residual_s
        )
        self.metrics.forward(
            ForwardRecord(
                forward=f.index,
                batch=f.batch,
                request_id=next(iter(f.decoded)) if len(f.decoded) == 1 else -1,
                phase=int(f.phase),
                measured=f.measured,
                start_s=t_start,
                duration_s=end - t_start,
                n_tokens=f.n_tokens,
                kv_len=f.kv_len,
                decoded=sum(f.decoded.values()),
                hits=n.hits,
                misses=n.misses,
                to_gpu=n.to_gpu,
                to_cpu=n.to_cpu,
                prefetch_copies=self._prefetch_copies,
                nonexpert_s=nonexpert_s,
                resident_expert_s=times.resident_expert_s,
                cpu_path_s=times.cpu_path_s,
                cpu_slowed_s=times.cpu_slowed_s,
                copies_slowed_s=times.copies_slowed_s,
            ),
            f.decoded,
        )

    def _forwards(self, env, engine: CopyEngine, forwards, knowledge_for_batch, batch_starts: dict):
        """The forwards as one SimPy process beside the copy engine's."""
        cost, topo, drv = self.cost, self.topo, self.driver
        cur_batch = None
        for f in forwards:
            self.calls.trim()
            if f.batch != cur_batch:
                cur_batch = f.batch
                batch_starts[f.batch] = env.now
                n_new = self._begin_batch(f, knowledge_for_batch)
                if n_new:
                    yield engine.submit_demand(-1, [None] * n_new)
            info = self._begin_forward(f)
            engine.begin_forward(f.index, f.measured)
            t_start = self._t_forward = env.now
            self.log(ForwardBegin(f.index))
            drv.begin_forward(info)
            pf = drv.forward_prefetch(info)
            if pf is not None and len(pf):
                engine.replace_prefetch(f.index, pf)
            times = ForwardTimes()
            self._pending = 0.0  # modelled time not yet spent (dense layers), folded into the next timeout
            ne, dense_s = self._layer_seconds(f)
            for lid in range(topo.n_layers):
                j = self.moe_index.get(lid)
                if j is None:
                    self._pending += dense_s
                    if not engine.idle():
                        yield env.timeout(self._pending)
                        self._pending = 0.0
                else:
                    yield from self._moe_layer(env, engine, f, info, j, ne, times)
            yield env.timeout(self._pending + cost.per_forward_seconds(f.n_tokens) + cost.forward_residual_s)
            if len(engine.prefetch):
                engine.replace_prefetch(f.index, [])  # prefetches never cross forwards
            self._prefetch_copies = engine.counts.this_forward
            self._end_forward(f, info, t_start, env.now, ne, dense_s, times)

    def _forwards_closed(self, forwards, knowledge_for_batch, batch_starts: dict) -> None:
        """The forwards of a policy that never prefetches: each forward's layers decided in order, then timed at once
        in closed form (``sim.closed_form.time_forward``), as the event loop would time them with the copy engine
        idle between layers."""
        cost, topo, drv = self.cost, self.topo, self.driver
        nm = len(self.moe_index)
        is_moe = np.array([lid in self.moe_index for lid in range(topo.n_layers)], bool)
        rows = np.zeros(nm, np.int64)
        cpu_s = np.zeros(nm)
        has_cpu = np.zeros(nm, bool)
        has_copies = np.zeros(nm, bool)
        h2d = cost.expert_h2d_seconds()
        fused = fused_forward_of(drv.policy, nm, topo.n_experts)
        now, after_cpu, cur_batch = 0.0, False, None
        self._prefetch_copies = 0
        for f in forwards:
            self.calls.trim()
            if f.batch != cur_batch:
                cur_batch = f.batch
                batch_starts[f.batch] = now
                n_new = self._begin_batch(f, knowledge_for_batch)
                if n_new:  # the copy engine copies them alone; the forward waits for the last
                    now = now + ((now + n_new * h2d) - now)
            info = self._begin_forward(f)
            t_start = self._t_forward = now
            drv.begin_forward(info)
            drv.forward_prefetch(info)
            times = ForwardTimes()
            ne, dense_s = self._layer_seconds(f)
            measured = f.measured
            if fused is not None:
                self._fused_forward(fused, f, measured, times, rows, has_cpu, has_copies, cpu_s)
            else:
                for j in range(nm):
                    w = self._decide(f, info, j)
                    rows[j] = self.calls.row(w.calls_key)
                    has_cpu[j] = bool(w.plan.to_cpu)
                    has_copies[j] = bool(w.plan.to_gpu)
                    cpu_s[j] = w.cpu_s
                    self._account(f, j, w, measured, 0, times)
            out = np.zeros(3)
            now, after_cpu = time_forward(
                now,
                is_moe,
                rows,
                self.calls.table,
                cpu_s,
                has_cpu,
                has_copies,
                ne,
                dense_s,
                self._result_s,
                cost.per_forward_seconds(f.n_tokens),
                cost.forward_residual_s,
                cost.bookkeeping_after_cpu_s,
                self._cpu_issue_s,
                cost.cpu_busy_gpu_s,
                cost.cpu_slowdown_beside_copies,
                cost.copies_slowdown_beside_cpu,
                after_cpu,
                out,
            )
            now = float(now)
            times.cpu_path_s = float(out[CPU_PATH])
            times.cpu_slowed_s = float(out[CPU_SLOWED])
            times.copies_slowed_s = float(out[COPIES_SLOWED])
            self._end_forward(f, info, t_start, now, ne, dense_s, times)

    def _fused_forward(
        self, fused, f: BatchedForward, measured: bool, times, rows, has_cpu, has_copies, cpu_s
    ):
        """Forward ``f``'s MoE layers decided in one compiled call (``sim.fused``), then accounted as :meth:`_account`
        accounts a layer: each layer's calls table row, CPU seconds and copies into ``rows``, ``has_cpu``, ``cpu_s``
        and ``has_copies``."""
        drv, calls = self.driver, self.calls
        decode = f.phase != PREFILL
        t0 = time.perf_counter()
        out = fused.forward(f, decode, drv.mask, drv.caps)
        drv.count_decisions(time.perf_counter() - t0, len(out))
        caps = (drv.caps if fused.caps_at is None else fused.caps_at).tolist()
        drv.mask_rows_set(range(len(out)))
        total = f.n_tokens * self.topo.top_k
        for j, (n_active, hits, _, n_gpu, gpu_pairs, n_cpu, cpu_pairs, effective, at) in enumerate(
            out.tolist()
        ):
            self._count_layer(
                j,
                times,
                decode=decode,
                measured=measured,
                n_active=n_active,
                n_hits=hits,
                capacity=caps[j],
                n_gpu=n_gpu,
                n_cpu=n_cpu,
                effective=effective,
                total_tok=total,
            )
            drv.count_layer(hits, n_gpu, n_cpu)
            miss_pairs = gpu_pairs + cpu_pairs
            rows[j] = calls.row((hits, total - miss_pairs, n_gpu, miss_pairs - cpu_pairs, n_cpu > 0))
            has_copies[j] = n_gpu > 0
            has_cpu[j] = n_cpu > 0
            cpu_s[j] = self._cpu_call_seconds(fused.cpu_tokens[at : at + n_cpu].tolist()) if n_cpu else 0.0

    def closed_form_only(self) -> bool:
        """Whether every layer of this run is timed in closed form: the policy never prefetches (its copy engine stays
        idle) and nothing records the run layer by layer."""
        return (
            self.closed_form
            and not self.driver.prefetches
            and self.schedule is None
            and self.layer_times is None
        )

    def run(
        self, forwards: Iterable[BatchedForward], knowledge_for_batch, oracle: ActivationOracle | None = None
    ) -> dict:
        """Run every forward of ``forwards`` (a list, or a stream read once: nothing here keeps a forward after it
        ran); returns {batch: start time}. Metrics accumulate in ``self.metrics``. A policy that reads the future
        gets ``oracle``, or one made from ``forwards`` (then read whole first)."""
        if self.driver.needs_future and oracle is None:
            forwards = list(forwards)
            oracle = ActivationOracle(forwards)
        self.driver.start(oracle if self.driver.needs_future else None)
        batch_starts: dict = {}
        if self.closed_form_only():
            self._forwards_closed(forwards, knowledge_for_batch, batch_starts)
            self.metrics.prefetch = PrefetchCounts()
        else:
            env = simpy.Environment()
            engine = CopyEngine(
                env,
                self.driver,
                self.cost.expert_h2d_seconds(),
                self.cost.expert_bytes,
                log=self.log if self.schedule is not None else None,
                on_prefetch_landed=self._prefetch_landed,
                cpu_and_copies=self.cost.cpu_and_copies,
            )
            env.process(self._forwards(env, engine, forwards, knowledge_for_batch, batch_starts))
            env.run()
            self.metrics.prefetch = engine.counts
        self.metrics.policy_wall_s = self.driver.policy_wall_s
        self.metrics.policy_calls = self.driver.policy_calls
        self.metrics.forward_hooks_wall_s = self.driver.forward_hooks_wall_s
        return batch_starts
