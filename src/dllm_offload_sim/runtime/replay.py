"""Replay mode: execute a policy's decisions on the real GPU over a trace's recorded routing.

The same policy object and the same batched forwards as the simulator; real work in their place:
the non-expert part of each layer (replayed CUDA graph at the model's shapes), demand expert copies
on the copy stream into slot-pool slots, grouped GPU compute over the hits and over the copied
experts (or one call over both when the cost model predicts the copies land early, the rule the
simulator uses; each call one captured graph that builds its routing plan on the GPU,
``runtime.grouped_graph``), CPU experts on a CPU engine overlapping the GPU (``runtime.cpu_engine``: the
native kt-kernel engine or the PyTorch reference, the one the profile measured), and the lm-head. Weights are
random (timing does not depend on values). Like a runtime that computes its routing, each MoE layer
waits for the layer's non-expert work (which holds the gate) before the policy decides; without that
wait the host would run ahead of the GPU on the trace's routing, which no real runtime can do.

Prefetching policies follow the simulator's schedule (``simulate(..., record_schedule=True)``):
where and when a prefetch copy started (and which resident it evicted), whether it was admitted,
and where each layer was reached and ended. The replay issues each prefetch copy at the same point
of the layer sequence, makes the same policy calls (``prefetch_victim``, ``on_prefetch_done``) and
waits, at the first layer that uses a prefetched expert, for its copy to land. So the policy sees
the same residency as in the simulator and the counters agree; whether the copies really arrived
in time shows up in the measured time.
"""

from __future__ import annotations

import time
from dataclasses import astuple, dataclass, fields
from functools import partial

import numpy as np
import pandas as pd
import torch

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.runtime.timing import host_launch_seconds
from dllm_offload_sim.policies.base import ForwardInfo, PolicyError
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.schedule.batch import ActivationOracle, BatchedForward
from dllm_offload_sim.schedule.events import (
    ForwardBegin,
    LayerEnd,
    LayerReach,
    Marker,
    PrefetchSkip,
    PrefetchStart,
    ScheduleEvent,
)
from dllm_offload_sim.schedule.summary import summarize
from dllm_offload_sim.schedule.timeline import layer_expert_calls
from dllm_offload_sim.traces.topology import ModelTopology
from dllm_offload_sim.runtime.arena import arena_layout
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_engine import profiled_cpu_engine
from dllm_offload_sim.runtime.grouped import MAX_GROUPS, grouped_ffn, plan_from_numpy
from dllm_offload_sim.runtime.grouped_graph import GroupedGraph, window_of
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.layer_stamps import LayerEvents, LayerStamps
from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
from dllm_offload_sim.runtime.shared_cpu_engines import SharedCpuEngines
from dllm_offload_sim.runtime.slot_pool import SlotPool


@dataclass
class HostTimes:
    """Where one replayed forward's host time went, summed over its MoE layers (seconds)."""

    cpu_wait_x_s: float = 0.0  # the CPU worker waiting for the layer's activations (reference engine)
    cpu_jobs_s: float = 0.0  # grouping each CPU expert's rows
    cpu_compute_s: float = 0.0  # the CPU experts
    cpu_blocked_s: float = 0.0  # the host thread waiting for the CPU result
    cpu_start_delay_s: float = 0.0  # submitted -> the worker running it
    cpu_return_delay_s: float = 0.0  # the worker done -> the host thread holding the result
    host_issue_s: float = 0.0  # routing on the host -> last launch, policy and prefetch events excluded
    # routing on the host -> first expert work, policy and prefetch events excluded
    bookkeeping_s: float = 0.0
    copy_issue_s: float = 0.0  # issuing demand copies
    # submitting the layer's CPU call (before its copies and grouped calls are issued)
    cpu_issue_s: float = 0.0
    # starting the schedule's prefetches and admitting them, the policy's hooks excluded
    prefetch_issue_s: float = 0.0
    # issuing the layers' grouped expert calls (inputs' upload, the graph's launch)
    grouped_issue_s: float = 0.0
    grouped_calls: int = 0  # the grouped calls issued
    # the native engine's stream-ordered CPU paths on the GPU's clock (activations down, experts, result up), read
    # once the forward is done; not host time, but what the simulator's CPU path predicts
    cpu_path_s: float = 0.0


@dataclass
class ReplayForward:
    """One replayed forward: what it was, how long it took, the driver's counts, and where its host time went."""

    forward: int
    batch: int
    phase: int
    measured: bool
    duration_s: float  # host clock, from the forward's first launch to the GPU done
    n_tokens: int
    decoded: int
    hits: int
    misses: int
    to_gpu: int
    to_cpu: int
    prefetch_copies: int  # the schedule's prefetches that landed in this forward and count
    policy_s: float  # the policy's decisions and hooks
    times: HostTimes
    gpu_backlog_s: float  # GPU work still queued when the host had issued the whole forward
    eager_calls: int  # grouped calls issued eagerly (a shape with no captured graph)

    def row(self) -> tuple:
        """The record as a row of :data:`FORWARD_COLUMNS` (the host times spread into their columns)."""
        return tuple(
            v
            for f in fields(self)
            for v in (astuple(self.times) if f.name == "times" else (getattr(self, f.name),))
        )


# the replay's per-forward table: ReplayForward's fields, HostTimes' in place of ``times``
FORWARD_COLUMNS = [
    name
    for f in fields(ReplayForward)
    for name in ([h.name for h in fields(HostTimes)] if f.name == "times" else [f.name])
]


class ReplayEngine:
    """Runs batched forwards under a policy (through its driver) on ``device``; returns measured per-forward
    records. The driver owns the residency; the engine mirrors it in the slot pool and times the real work."""

    def __init__(
        self,
        topo: ModelTopology,
        driver: ResidencyDriver,
        cost: CostModel,
        device="cuda",
        n_real_layers: int = 1,
        cpu_workers: int = 1,
        dtype=torch.bfloat16,
        host: HostExperts | None = None,
        schedule: list[ScheduleEvent] | None = None,
        cpu_engine: str | None = None,
        cpu_engines: SharedCpuEngines | None = None,
        graphs: ReplayGraphs | None = None,
        record_layers: bool = False,
    ):
        policy = driver.policy
        if policy.prefetches and schedule is None:
            raise PolicyError(
                f"replay of prefetching policy '{policy.name}' needs the simulator's schedule "
                f"(simulate(..., record_schedule=True).schedule)"
            )
        self.schedule = schedule
        self.topo, self.driver, self.cost, self.device, self.dtype = (
            topo,
            driver,
            cost,
            torch.device(device),
            dtype,
        )
        self.cuda = self.device.type == "cuda"
        self.host = host or HostExperts(topo, n_real_layers=n_real_layers, dtype=dtype, pin=self.cuda)
        homes, n_slots = arena_layout(topo, driver.ctx.cache, driver.ctx.total_slots, self.device)
        self.pool = SlotPool(
            n_slots,
            topo.hidden,
            topo.moe_intermediate,
            dtype=dtype,
            device=self.device,
            home=homes,
            window=MAX_GROUPS,
            n_experts=topo.n_experts,
        )
        self.copier = ExpertCopier(self.host, self.pool, self.device)
        # the CPU experts run on the engine and threads the profile's CPU curve was measured with; built in
        # prepare(), sized for the largest forward, or lent by ``cpu_engines`` (then not closed here)
        self.cpu, self._cpu_spec, self._cpu_tokens = None, (cpu_engine, cpu_workers), 0
        self._shared_cpu = cpu_engines
        # the non-expert work's graphs and buffers, or lent by ``graphs`` (then kept at close())
        if graphs is not None and (
            graphs.topo != topo or graphs.device != self.device or graphs.dtype != dtype
        ):
            raise ValueError(
                f"ReplayEngine: the lent graphs are for {graphs.topo.name} on {graphs.device} in "
                f"{graphs.dtype}, this replay is {topo.name} on {self.device} in {dtype}"
            )
        self.graphs = graphs or ReplayGraphs(topo, self.device, dtype)
        self._own_graphs = graphs is None
        self.moe_index = {lid: j for j, lid in enumerate(topo.moe_layers)}
        # with record_layers: one LayerStamps per MoE layer replayed (the validator's per-layer timeline); timing
        # events on the compute stream then add ~10 us of host time per layer
        self.layer_stamps: list | None = [] if record_layers else None
        self._layer_events: list = []  # this forward's LayerEvents, on a GPU
        self._gate_event = None  # the current layer's routing computed, on the GPU's clock
        # with record_layers on a GPU: the current layer's demand copies landed (an event)
        self._layer_copies = None
        self._t_forward = 0.0  # the current forward's start on the host's clock
        self._grouped: dict = {}  # (tokens, slot block) -> GroupedGraph over this engine's slot pool
        # (hits, their pairs, copies, their pairs, a CPU call beside) -> the layer's grouped calls by the simulator's rule
        # (layer_expert_calls): layers repeat a few shapes, and each costs four of the cost model's curve lookups
        self._calls: dict = {}
        # the stream the forwards run on (the current one at run(), which the replay never leaves; None on a CPU),
        # looked up once and handed on: a lookup costs ~30 us of host time on a loaded GPU host, a layer makes six
        self._compute = None

    # ---- graphs of the non-expert work, one per (tokens, kv length), and of the grouped expert calls,
    # one per (tokens, slot block), captured before timing
    def prepare(self, forwards: list[BatchedForward]) -> None:
        """Build what ``forwards`` need (the CPU engine, the KV cache, buffers and graphs); a second call adds only
        what is missing."""
        most = max(f.n_tokens for f in forwards)
        if self.cpu is None or most > self._cpu_tokens:
            engine, workers = self._cpu_spec
            if self._shared_cpu is not None:
                self.cpu = self._shared_cpu.get(self.cost, self.host, self.device, engine, workers, most)
            else:
                if self.cpu is not None:
                    self.cpu.close()
                self.cpu = profiled_cpu_engine(
                    self.cost, self.host, self.device, engine, workers, max_tokens=most
                )
            self._cpu_tokens = most
        # the CPU engine's call buffers for every forward size, pinned now rather than in a timed forward
        self.cpu.reserve(
            sorted({f.n_tokens for f in forwards}), self.topo.top_k, self.topo.hidden, self.dtype
        )
        # the per-layer timeline reads the CPU task's end
        self.cpu.stage_events = self.layer_stamps is not None
        self.graphs.prepare(forwards)
        ns = self.pool.n_slots
        for T in sorted({f.n_tokens for f in forwards}):
            x, out = self.graphs.x[T]
            for b in range(-(-ns // MAX_GROUPS)):
                if (T, b) not in self._grouped:
                    self._grouped[(T, b)] = GroupedGraph(
                        x,
                        out,
                        self.topo.top_k,
                        self.topo.n_experts,
                        (b * MAX_GROUPS, min(MAX_GROUPS, ns - b * MAX_GROUPS)),
                        self.pool.w13,
                        self.pool.w2,
                    )
        if self.cuda:
            torch.cuda.synchronize()

    # ---- the simulator's prefetch schedule (prefetching policies) ---------------------------------
    def _set_pool(self, j: int) -> None:
        """Layer ``j``'s slots hold its residents plus any prefetch still on the wire for it."""
        self.pool.set_layer(j, set(self.driver.resident[j]) | self._inflight.get(j, set()))

    def _follow(self, until: Marker) -> None:
        """Apply the schedule's prefetch events up to the marker ``until`` (a forward begin, a layer
        reach or end): the same policy calls and residency changes as in the simulator, with real copies."""
        if self.schedule is None:
            return
        drv, sched = self.driver, self.schedule
        t0, pol0 = time.perf_counter(), drv.counts.policy_s
        while self._cursor < len(sched):
            ev = sched[self._cursor]
            self._cursor += 1
            if isinstance(ev, Marker):
                if ev != until:
                    raise RuntimeError(
                        f"replay out of step with the simulator's schedule: at {until}, schedule has {ev}"
                    )
                self._prefetch_host_s += time.perf_counter() - t0 - (drv.counts.policy_s - pol0)
                return
            layer, e = ev.layer, ev.expert
            if isinstance(ev, (PrefetchSkip, PrefetchStart)):
                logged = ev.victim
                v = -1
                if isinstance(ev, PrefetchSkip) or logged >= 0:
                    v = drv.prefetch_victim(layer, e)
                    v = -1 if v is None else v
                    if v != logged:
                        raise RuntimeError(
                            f"policy '{drv.name}' chose prefetch victim {v} for ({layer}, {e}) where "
                            f"the simulator's run chose {logged}"
                        )
                if isinstance(ev, PrefetchStart):
                    if v >= 0:
                        drv.evict(layer, v)
                        self.pool.evict(layer, v)
                    self._pending[(layer, e)] = self.copier.prefetch_now(layer, e, self.pool.assign(layer, e))
                    self._inflight.setdefault(layer, set()).add(e)
            else:  # PrefetchDone
                self._inflight[layer].discard(e)
                if ev.admitted:
                    drv.prefetch_arrived(layer, e)
                else:
                    self.pool.evict(layer, e)
                    self._pending.pop((layer, e), None)
                self._prefetched += ev.measuring
        raise RuntimeError(f"the simulator's schedule ended before {until}")

    def _demand(self, j: int, g: list, slots: list, times: HostTimes):
        """Issue layer ``j``'s demand copies; the host time it takes goes to ``times``."""
        tc = time.perf_counter()
        ev = self.copier.demand(j, g, slots)
        times.copy_issue_s += time.perf_counter() - tc
        if (
            self.layer_stamps is not None and self.cuda
        ):  # the per-layer timeline: when they land, on the GPU's clock
            self._layer_copies = torch.cuda.Event(enable_timing=True)
            self._layer_copies.record(self.copier.stream)
        return ev

    def _grouped_call(
        self,
        x,
        out_ext,
        ids: np.ndarray,
        w: np.ndarray,
        lut: np.ndarray,
        active: np.ndarray,
        times: HostTimes,
        ready=None,
    ) -> None:
        """One grouped call over the experts of ``active`` that have a slot in ``lut``, after the event
        ``ready`` (the layer's demand copies): the captured graph of their slot block, uploaded before
        the wait; eagerly (counted in ``self._eager``) where their slots span two blocks. Its host time goes to
        ``times``."""
        t0 = time.perf_counter()
        self._issue_grouped(x, out_ext, ids, w, lut, active, ready)
        times.grouped_issue_s += time.perf_counter() - t0
        times.grouped_calls += 1

    def _issue_grouped(self, x, out_ext, ids, w, lut, active, ready) -> None:
        s = lut[active]
        gg = self._grouped.get((x.shape[0], window_of(s[s >= 0])))
        if gg is not None:
            gg.upload(ids, w, lut, self._compute)
        else:
            plan = plan_from_numpy(ids, w, lut, self.pool.n_slots, self.device)
            self._eager += 1
        if ready is not None:
            self._compute.wait_event(ready)
        if gg is not None:
            gg.replay()
        else:
            grouped_ffn(x, self.pool.w13, self.pool.w2, plan, out=out_ext[: x.shape[0]])

    def _lut_of(self, live: np.ndarray, experts: list) -> np.ndarray:
        """A slot table holding only ``experts`` (their slots in ``live``)."""
        lut = np.full(self.topo.n_experts, -1, np.int64)
        lut[experts] = live[experts]
        return lut

    def _moe_layer(self, f: BatchedForward, info: ForwardInfo, j: int, times: HostTimes) -> None:
        """MoE layer ``j`` of forward ``f``, its non-expert work issued: wait for the routing, ask the
        policy, start the CPU path, issue the demand copies and the grouped calls, collect the CPU results
        and mirror the residency. Where the host's time went goes to ``times``."""
        topo, drv, cost = self.topo, self.driver, self.cost
        x, out_ext = self.graphs.x[f.n_tokens]
        if self.cuda:  # a runtime needs the gate's routing on the host before it decides: wait for it
            self._compute.synchronize()
        t_ready = time.perf_counter()
        pol_before, pf_before = drv.counts.policy_s, self._prefetch_host_s
        self._follow(LayerReach(f.index, j))
        # the schedule's prefetch events, counted apart (prefetch_issue_s)
        apart = self._prefetch_host_s - pf_before
        active, tokens = f.routing(j)
        ids_np, w_np = f.ids_by_layer[j], f.weights_by_layer[j]
        plan = drv.decide(info, j, ids_np, w_np, active, tokens)
        t_decided = time.perf_counter()
        for t in plan.trimmed:  # a policy sharing slots between layers evicted from other layers
            self._set_pool(t)
        g, c = plan.to_gpu, plan.to_cpu
        missed = plan.view.missed
        live = self.pool.layer_lut(j, topo.n_experts)  # residents' slots (+ prefetches on the wire)
        lut_h = live.copy()
        lut_h[missed] = -1  # a prefetch still on the wire is not a hit
        if self._pending:
            hits = active[
                ~plan.is_miss
            ].tolist()  # prefetched experts used here: the compute waits for their copies
            for e in hits:
                pev = self._pending.pop((j, e), None)
                if pev is not None and self.cuda:
                    self._compute.wait_event(pev)
        times.bookkeeping_s += time.perf_counter() - t_ready - apart - (drv.counts.policy_s - pol_before)
        cpu_call = None
        if c:  # the CPU path starts after the layer's non-expert work and overlaps the GPU path
            cpu_call = self.cpu.submit(j, x, ids_np, w_np, c, self._compute)
        t_submitted = time.perf_counter()
        total_tok = f.n_tokens * topo.top_k
        n_h = plan.n_hits
        hit_tok = total_tok - sum(plan.missed_tokens)
        together = False
        if g:  # the simulator's rule: one call over hits and copies, or the hits' call first
            tok_of = dict(zip(plan.missed, plan.missed_tokens))
            g_tok = sum(tok_of[e] for e in g)
            shape = (n_h, hit_tok, len(g), g_tok, bool(c))
            calls = self._calls.get(shape)
            if calls is None:  # a layer with a CPU call issues its grouped calls beside the engine
                call = partial(cost.grouped_call_seconds, beside_cpu=bool(c))
                calls = self._calls[shape] = layer_expert_calls(call, cost.expert_h2d_seconds(), *shape[:4])
            together = calls.together
            slots = self.pool.assign_many(j, g)
        if together:  # copies first; the call's inputs go up while they copy, its kernels wait
            ev = self._demand(j, g, slots, times)
            self._grouped_call(
                x, out_ext, ids_np, w_np, np.maximum(lut_h, self._lut_of(live, g)), active, times, ev
            )
        else:
            if n_h:  # the hits' call first: its kernels run while the copies land
                self._grouped_call(x, out_ext, ids_np, w_np, lut_h, active, times)
            if g:
                ev = self._demand(j, g, slots, times)
                self._grouped_call(x, out_ext, ids_np, w_np, self._lut_of(live, g), active, times, ev)
        t_issued = time.perf_counter()
        times.host_issue_s += t_issued - t_ready - apart - (drv.counts.policy_s - pol_before)
        path, computed = None, None
        if (
            cpu_call is not None
        ):  # the layer's output gets the CPU experts' sum (on a GPU: queued, stream-ordered)
            ct = self.cpu.finish(cpu_call, self.graphs.rows[f.n_tokens], self._compute)
            if ct.path is not None:
                self._cpu_paths.append(ct.path)
                path, computed = ct.path, ct.computed
            times.cpu_blocked_s += ct.blocked_s
            times.cpu_wait_x_s += ct.wait_x_s
            times.cpu_jobs_s += ct.jobs_s
            times.cpu_compute_s += ct.compute_s
            times.cpu_start_delay_s += ct.start_delay_s
            times.cpu_return_delay_s += ct.return_delay_s
            times.cpu_issue_s += ct.issue_s
        self._follow(LayerEnd(f.index, j))
        if drv.end_layer(j, plan) or g or self._inflight.get(j):  # else the pool already holds exactly it
            self._set_pool(j)
        if self.layer_stamps is not None:
            t0 = self._t_forward
            st = LayerStamps(
                f.index,
                j,
                t_ready - t0,
                t_decided - t0,
                t_submitted - t0,
                t_issued - t0,
                time.perf_counter() - t0,
                to_gpu=len(g),
                to_cpu=len(c),
            )
            self.layer_stamps.append(st)
            if self.cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._layer_events.append(
                    LayerEvents(st, self._gate_event, end, path, computed, self._layer_copies)
                )
            self._layer_copies = None

    def run(self, forwards: list[BatchedForward], knowledge_for_batch) -> pd.DataFrame:
        """Replay ``forwards``; one row per forward (time, counters, where the host's time went)."""
        topo, drv = self.topo, self.driver
        self.prepare(forwards)
        self.host_launch_s = host_launch_seconds(self.device)  # the host's speed now, vs the profile's stamp
        self._compute = torch.cuda.current_stream(self.device) if self.cuda else None
        self._cursor, self._pending, self._inflight = 0, {}, {}
        for j in drv.start(ActivationOracle(forwards) if drv.needs_future else None):
            self.pool.set_layer(j, drv.resident[j])
        rows, cur_batch = [], None
        for f in forwards:
            if f.batch != cur_batch:
                cur_batch = f.batch
                for j in drv.begin_batch(knowledge_for_batch(f.batch)):
                    self.pool.set_layer(j, drv.resident[j])
            g_moe, g_dense, g_head = self.graphs.graphs[(f.n_tokens, f.kv_len)]
            info = f.info()
            if self.cuda:
                torch.cuda.synchronize()
            t0 = self._t_forward = time.perf_counter()
            stamped = self.layer_stamps is not None and self.cuda
            if stamped:
                begin = torch.cuda.Event(enable_timing=True)
                begin.record()
                self._layer_events = []
            self._prefetched = self._eager = 0
            self._prefetch_host_s = 0.0  # this forward's host time in prefetch events (_follow)
            self._cpu_paths = []  # (start, end) timing events of this forward's stream-ordered CPU calls
            self._follow(ForwardBegin(f.index))
            for j in drv.begin_forward(info):
                self._set_pool(j)
            drv.forward_prefetch(
                info
            )  # its plan is in the schedule; the call keeps the policy's state in step
            times = HostTimes()
            self.graphs.x[f.n_tokens][1].zero_()  # the layers' expert outputs (and the scratch row)
            for lid in range(topo.n_layers):
                j = self.moe_index.get(lid)
                if j is None:
                    g_dense()
                    continue
                g_moe()
                if stamped:
                    self._gate_event = torch.cuda.Event(enable_timing=True)
                    self._gate_event.record()
                self._moe_layer(f, info, j, times)
            g_head()
            n = drv.end_forward(info)
            t_host = time.perf_counter()
            if self.cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            backlog = dt - (t_host - t0)  # GPU work still queued when the host had issued the whole forward
            times.cpu_path_s = sum(a.elapsed_time(b) for a, b in self._cpu_paths) / 1e3
            times.prefetch_issue_s = self._prefetch_host_s
            if stamped:
                for ev in self._layer_events:
                    ev.stamp(begin)
            rows.append(
                ReplayForward(
                    f.index,
                    f.batch,
                    int(f.phase),
                    f.measured,
                    dt,
                    f.n_tokens,
                    sum(f.decoded.values()),
                    n.hits,
                    n.misses,
                    n.to_gpu,
                    n.to_cpu,
                    self._prefetched,
                    n.policy_s,
                    times,
                    backlog,
                    self._eager,
                )
            )
        return pd.DataFrame([r.row() for r in rows], columns=FORWARD_COLUMNS)

    def layers_table(self) -> pd.DataFrame:
        """The recorded :class:`LayerStamps` as a table (empty without ``record_layers``)."""
        cols = [f.name for f in fields(LayerStamps)]
        return pd.DataFrame([astuple(s) for s in self.layer_stamps or []], columns=cols)

    def close(self):
        """Stop the CPU threads and give the device memory back (slot arena, grouped graphs, and the non-expert
        graphs and buffers unless they were lent), so that the next run's arena fits: a sweep runs many engines in
        one process. The engine is unusable after."""
        if self.cpu is not None and self._shared_cpu is None:
            self.cpu.close()
        if self._own_graphs:
            self.graphs.close()
        self._grouped.clear()
        self.pool = self.copier = None
        if self.cuda:
            torch.cuda.empty_cache()


def replay_summary(pf: pd.DataFrame) -> dict:
    """TPOT, TTFT-like first forward time and counters from measured per-forward records."""
    meas = pf[pf.measured]
    totals = summarize(pf)
    return {
        "tpot_ms": totals.tpot_ms,
        "prefill_ms": totals.prefill_ms,
        "hits": int(meas.hits.sum()),
        "demand_copies": int(meas.to_gpu.sum()),
        "cpu_experts": int(meas.to_cpu.sum()),
        "prefetch_copies": int(pf.prefetch_copies.sum()),
        "policy_ms_per_forward": 1e3 * float(meas.policy_s.mean()),
        "eager_grouped_calls": int(meas.eager_calls.sum()),
    }
