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

from collections.abc import Iterable
from dataclasses import dataclass

import simpy

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.policies.base import ForwardInfo
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.schedule.batch import ActivationOracle, BatchedForward
from dllm_offload_sim.schedule.events import ForwardBegin, LayerEnd, LayerReach, ScheduleEvent
from dllm_offload_sim.sim.copy_engine import CopyEngine, CpuCall
from dllm_offload_sim.sim.metrics import ForwardRecord, RunMetrics
from dllm_offload_sim.schedule.timeline import ExpertCalls, cpu_makespan, layer_expert_calls, layer_span
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


class Simulation:
    """Replays a list of batched forwards under one policy (through its driver) and cost model.

    ``closed_form``: a layer that nothing can interleave with (copy engine idle, no prefetch planned) is timed
    in closed form and its time spent with the next timeout; False times every layer as events (the same
    :class:`ExpertCalls` arithmetic; a test holds the two equal).
    """

    def __init__(
        self,
        topology: ModelTopology,
        driver: ResidencyDriver,
        cost: CostModel,
        cpu_workers: int = 1,
        closed_form: bool = True,
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
        self._gpu_memo: dict = {}  # (experts, tokens) -> (one grouped call's seconds, its kernels' seconds)
        self._calls_memo: dict = {}  # see _expert_calls
        self._dispatch_s = 0.0  # cost.cpu_dispatch_seconds of the current forward's tokens
        self._result_s = 0.0  # cost.cpu_result_seconds of the current forward's tokens
        self._cpu_costs = cost.cpu_call_costs  # CPU seconds of each expert of a layer's CPU call
        # the host submitting a layer's CPU call before it issues the GPU path
        self._cpu_issue_s = cost.cpu_issue_s
        # the previous MoE layer ran a CPU call (its next layer's bookkeeping runs slower)
        self._after_cpu = False

    def _gpu_call(self, n: int, tokens: int, beside_cpu: bool = False) -> tuple:
        """``cost.grouped_call_seconds(n, tokens, beside_cpu)`` (the call, its kernels), memoised."""
        key = (n, tokens, beside_cpu)
        v = self._gpu_memo.get(key)
        if v is None:
            v = self._gpu_memo[key] = self.cost.grouped_call_seconds(n, tokens, beside_cpu)
        return v

    def _gpu_call_beside_cpu(self, n: int, tokens: int) -> tuple:
        return self._gpu_call(n, tokens, True)

    def _expert_calls(
        self, n_hits: int, hit_tok: int, n_gpu: int, g_tok: int, beside_cpu: bool
    ) -> ExpertCalls:
        """A layer's grouped GPU calls when ``n_gpu`` copied experts (``g_tok`` pairs) join ``n_hits`` hits
        (``hit_tok`` pairs), its CPU call running meanwhile if ``beside_cpu``, memoised (layers repeat the same few
        shapes)."""
        key = (n_hits, hit_tok, n_gpu, g_tok, beside_cpu)
        v = self._calls_memo.get(key)
        if v is None:
            call = self._gpu_call_beside_cpu if beside_cpu else self._gpu_call
            v = self._calls_memo[key] = layer_expert_calls(call, self.cost.expert_h2d_seconds(), *key[:4])
        return v

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

    def _cpu_seconds(self, plan, t_gate: float) -> tuple[float, int]:
        """When a layer's CPU experts are done if its activations are ready at ``t_gate``, and their tokens."""
        c = plan.to_cpu
        if len(c) <= 8:  # a few CPU experts: look each up (cheaper than a dict of every miss)
            idx = plan.missed.index
            c_tok = [plan.missed_tokens[idx(e)] for e in c]
        else:
            c_tok = list(map(dict(zip(plan.missed, plan.missed_tokens)).__getitem__, c))
        end = t_gate + (self._dispatch_s + cpu_makespan(self._cpu_costs(c_tok), self.cpu_workers))
        return end, sum(c_tok)

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
        m, drv = self.metrics, self.driver
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
            if inf is not None and inf[0] == j and not row[inf[1]] and f.counts[j, inf[1]]:
                yield inf[2]  # wait for the prefetch already on the wire
                late = int(row[inf[1]])
        else:
            engine.layer = j
        sched = self.schedule
        if sched is not None:
            sched.append(LayerReach(f.index, j))
        active, tokens = f.routing(j)
        plan = drv.decide(info, j, f.ids_by_layer[j], f.weights_by_layer[j], active, tokens)
        g, c = plan.to_gpu, plan.to_cpu
        n_hits = len(active) - len(plan.missed)

        total_tok = f.n_tokens * self.topo.top_k
        miss_tok = sum(plan.missed_tokens)
        cpu_alone, c_tok = None, 0
        if c:
            cpu_alone, c_tok = self._cpu_seconds(plan, t_gate)
        key = (n_hits, total_tok - miss_tok, len(g), miss_tok - c_tok, bool(c))
        calls = self._calls_memo.get(key) or self._expert_calls(*key)
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

        decode = f.phase != PREFILL
        measured = engine.measuring
        fi = f.index
        if self.layer_times is not None:
            t0 = self._t_forward
            nan = float("nan")
            self.layer_times.append(
                LayerTimes(
                    fi,
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
        slots = self.copied[j]
        if measured and decode:  # effective transfers: copied in the previous forward, hit now
            prev = slots[1][1] if slots[1][0] == fi - 1 else (slots[0][1] if slots[0][0] == fi - 1 else None)
            if prev and n_hits:
                m.effective += len(prev.intersection(active[~plan.is_miss].tolist()))
        if sched is not None:
            sched.append(LayerEnd(fi, j))
        drv.end_layer(j, plan)
        if decode:
            if slots[1][0] != fi:  # record_copies(j, fi, g), inlined
                slots[0] = slots[1]
                slots[1] = (fi, set(g))
            else:
                slots[1][1].update(g)
            if measured:
                m.transfers_decode += len(g)
        if measured:
            m.late_prefetch_hits += late
            m.layer(j, len(active), n_hits, plan.view.capacity, len(g), len(c), decode)
        times.resident_expert_s += self._gpu_call(len(active), total_tok)[0]

    def _forwards(self, env, engine: CopyEngine, forwards, knowledge_for_batch, batch_starts: dict):
        cost, topo, drv = self.cost, self.topo, self.driver
        cur_batch = None
        for f in forwards:
            if f.batch != cur_batch:
                cur_batch = f.batch
                batch_starts[f.batch] = env.now
                before = list(drv.resident)
                placed = drv.begin_batch(knowledge_for_batch(f.batch))
                n_new = sum(len(drv.resident[j] - before[j]) for j in placed)
                if (
                    n_new
                ):  # a static placement is copied like any other expert, before the batch's first forward
                    if f.measured:
                        self.metrics.placement_copies += n_new
                    yield engine.submit_demand(-1, [None] * n_new)
            self.decode_forward = f.phase != PREFILL
            engine.begin_forward(f.index, f.measured)
            info = ForwardInfo(
                index=f.index,
                phase=f.phase,
                n_tokens=f.n_tokens,
                prev_confidence=f.prev_confidence,
                own_confidence=f.own_confidence,
                masked=f.masked,
                block_start=f.block_start,
                request_ids=tuple(f.decoded),
            )
            t_start = self._t_forward = env.now
            self.log(ForwardBegin(f.index))
            drv.begin_forward(info)
            pf = drv.forward_prefetch(info)
            if pf is not None and len(pf):
                engine.replace_prefetch(f.index, pf)
            times = ForwardTimes()
            self._pending = 0.0  # modelled time not yet spent (dense layers), folded into the next timeout
            ne = (
                cost.non_expert_seconds(f.n_tokens, f.kv_len)
                + cost.policy_per_layer_s
                + cost.layer_overhead_s
            )
            dense_s = cost.dense_layer_seconds(f.n_tokens, f.kv_len)
            self._dispatch_s = cost.cpu_dispatch_seconds(f.n_tokens)
            self._result_s = cost.cpu_result_seconds(f.n_tokens)
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
            n = drv.end_forward(info)
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
                    duration_s=env.now - t_start,
                    n_tokens=f.n_tokens,
                    kv_len=f.kv_len,
                    decoded=sum(f.decoded.values()),
                    hits=n.hits,
                    misses=n.misses,
                    to_gpu=n.to_gpu,
                    to_cpu=n.to_cpu,
                    prefetch_copies=engine.counts.this_forward,
                    nonexpert_s=nonexpert_s,
                    resident_expert_s=times.resident_expert_s,
                    cpu_path_s=times.cpu_path_s,
                    cpu_slowed_s=times.cpu_slowed_s,
                    copies_slowed_s=times.copies_slowed_s,
                ),
                f.decoded,
            )

    def run(
        self, forwards: Iterable[BatchedForward], knowledge_for_batch, oracle: ActivationOracle | None = None
    ) -> dict:
        """Run every forward of ``forwards`` (a list, or a stream read once: nothing here keeps a forward after it
        ran); returns {batch: start time}. Metrics accumulate in ``self.metrics``. A policy that reads the future
        gets ``oracle``, or one made from ``forwards`` (then read whole first)."""
        env = simpy.Environment()
        if self.driver.needs_future and oracle is None:
            forwards = list(forwards)
            oracle = ActivationOracle(forwards)
        self.driver.start(oracle if self.driver.needs_future else None)
        engine = CopyEngine(
            env,
            self.driver,
            self.cost.expert_h2d_seconds(),
            self.cost.expert_bytes,
            log=self.log if self.schedule is not None else None,
            on_prefetch_landed=self._prefetch_landed,
            cpu_and_copies=self.cost.cpu_and_copies,
        )
        batch_starts: dict = {}
        env.process(self._forwards(env, engine, forwards, knowledge_for_batch, batch_starts))
        env.run()
        self.metrics.prefetch = engine.counts
        self.metrics.policy_wall_s = self.driver.policy_wall_s
        self.metrics.policy_calls = self.driver.policy_calls
        self.metrics.forward_hooks_wall_s = self.driver.forward_hooks_wall_s
        return batch_starts
