"""The discrete-event engine: one SimPy Environment replays batched forwards under a policy.

Resources mirror the GPU runtime (../shared/DESIGN.md §2.5):

* the GPU compute stream: the forward process below runs layers in order; per MoE layer it
  spends the non-expert time (attention, norms, gate, shared expert), one grouped call over the
  hit experts, and, once the demand copies have landed, one grouped call over the copied experts;
* the H2D copy engine (:class:`CopyEngine`): one copy at a time, demand batches before queued
  prefetches, prefetches for a layer already reached in this forward dropped, a prefetch into a
  full layer evicting the victim the policy names (or skipped);
* the CPU worker pool: missed experts the policy sends to the CPU, list-scheduled on
  ``cpu_workers`` workers after the activations are dispatched; they overlap with the GPU path, and
  each demand copy the host issues meanwhile delays them (profile ``runtime.cpu_stall_per_copy_s``).

A layer ends when the GPU stream and the CPU are both done with it. Events are per layer and per
copied expert (demand copies of one layer form one job), never per byte.
"""

from __future__ import annotations

import heapq
import time
from collections import deque

import numpy as np
import simpy

from costmodel.cost_model import CostModel
from policies.base import ClairvoyantPolicy, CostHints, ForwardInfo, LayerView, Policy, PolicyError
from sim.batch import ActivationOracle, BatchedForward
from sim.metrics import RunMetrics
from traces.schema import PREFILL
from traces.topology import ModelTopology


def check_decision(name: str, view: LayerView, d, j: int, capacity: int, missed: list):
    """Validate a policy's answer for MoE layer ``j``; returns (to_gpu, to_cpu, retain).

    Shared by the simulator and the GPU validator so both refuse the same impossible answers.
    """
    g, c = list(d.to_gpu), list(d.to_cpu)
    if len(g) + len(c) != len(missed) or sorted(g + c) != sorted(missed):  # (sorting a sorted list is cheap)
        raise PolicyError(f"policy '{name}' at forward {view.forward.index}, MoE layer {j}: to_gpu "
                          f"and to_cpu must split the {len(missed)} missed experts exactly")
    retain = d.retain if isinstance(d.retain, (set, frozenset)) else set(d.retain)
    if len(retain) > capacity:
        raise PolicyError(f"policy '{name}' retained {len(retain)} experts at layer {j}, capacity {capacity}")
    extra = retain - view.resident
    if extra and not extra <= set(g):
        raise PolicyError(f"policy '{name}' retained experts {sorted(extra - set(g))[:5]} at layer {j} "
                          f"that are neither resident nor copied")
    return g, c, retain


def cpu_makespan(costs: list[float], workers: int) -> float:
    """Finish time of jobs list-scheduled in order on ``workers`` identical workers."""
    if workers <= 1 or len(costs) <= 1:
        return float(sum(costs))
    free = [0.0] * min(workers, len(costs))
    for c in costs:
        t = heapq.heappop(free)
        heapq.heappush(free, t + c)
    return max(free)


def copies_after_hits_s(hit: tuple) -> float:
    """How long a layer's demand copies wait when the hits' call is issued first: its host part."""
    return hit[0] - hit[1]


def expert_calls_together(copies_s: float, hit: tuple, copied: tuple, both: tuple) -> bool:
    """Whether one grouped call over hits and copies ends sooner than a call over the hits followed by
    one over the copies, when the copies take ``copies_s`` on an idle copy engine. One call: the copies
    are issued first and the call waits for them. Two calls: the hits' call is issued first (its kernels
    run while the copies land), then the copies, then the copies' call. The simulator and the
    validator's replay both take this rule."""
    return (expert_calls_end(0.0, copies_s, True, hit, copied, both)
            < expert_calls_end(0.0, copies_after_hits_s(hit) + copies_s, False, hit, copied, both))


def expert_calls_end(t0: float, arrive: float, together: bool, hit: tuple, copied: tuple, both: tuple) -> float:
    """When a layer's grouped GPU calls end if the host starts issuing them at ``t0`` and the demand
    copies land at ``arrive``. Each call is (seconds when issued with the GPU idle, seconds of its kernels
    alone): a call waiting for copies is issued ahead of them (its host part overlaps them) and only
    its kernels wait."""
    if together:
        all_s, all_dev = both
        return max(t0 + all_s - all_dev, arrive) + all_dev
    hit_s, hit_dev = hit
    g_s, g_dev = copied
    return max(t0 + hit_s, t0 + (hit_s - hit_dev) + (g_s - g_dev), arrive) + g_dev


class PrefetchQueue:
    """Queued prefetches, best first, as an ``[N, 2]`` array of (layer, expert) read with a cursor."""

    def __init__(self, items=None):
        a = np.asarray(items if items is not None and len(items) else np.zeros((0, 2)), np.int64).reshape(-1, 2)
        self.items, self.pos = a, 0

    def __len__(self) -> int:
        return len(self.items) - self.pos

    def pop_missing(self, resmask: np.ndarray):
        """Pop the next entry whose expert is not resident yet (skipping resident ones); None if none."""
        rest = self.items[self.pos:]
        if not len(rest):
            return None
        miss = ~resmask[rest[:, 0], rest[:, 1]]
        i = int(np.argmax(miss))
        if not miss[i]:
            self.pos = len(self.items)
            return None
        self.pos += i + 1
        return int(rest[i, 0]), int(rest[i, 1])

    def drop_layer(self, layer: int) -> int:
        """Drop every pending entry for ``layer``; returns how many."""
        rest = self.items[self.pos:]
        keep = rest[:, 0] != layer
        n = len(rest) - int(keep.sum())
        if n:
            self.items, self.pos = rest[keep], 0
        return n

    def drop_through(self, layer: int) -> int:
        """Drop pending entries for layers <= ``layer`` (reached: stale or now demand); returns how many."""
        rest = self.items[self.pos:]
        keep = rest[:, 0] > layer
        n = len(rest) - int(keep.sum())
        if n:
            self.items, self.pos = rest[keep], 0
        return n


class CopyEngine:
    """The host-to-device copy engine: serial copies, demand first, stale prefetches dropped."""

    def __init__(self, env: simpy.Environment, sim: "Simulation"):
        self.env, self.sim = env, sim
        self.demand: deque = deque()  # (layer, experts, event)
        self.prefetch = PrefetchQueue()  # of the forward ``self.prefetch_forward``
        self.prefetch_forward = -1
        self.inflight = None  # (layer, expert, event) of the prefetch being copied
        self.wake = None
        env.process(self.run())

    def _poke(self):
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def idle(self) -> bool:
        """Nothing copying and nothing queued."""
        return self.inflight is None and not self.demand and not len(self.prefetch)

    def submit_demand(self, layer: int, experts: list) -> simpy.Event:
        ev = self.env.event()
        self.demand.append((layer, experts, ev))
        self._poke()
        return ev

    def replace_prefetch(self, forward: int, items) -> None:
        """A re-plan: queued (not yet started) prefetches are replaced by ``items`` ((layer, expert) pairs)."""
        self.sim.metrics.prefetch_dropped += len(self.prefetch)
        self.prefetch = PrefetchQueue(items)
        self.prefetch_forward = forward
        self._poke()

    def reach_layer(self, layer: int) -> None:
        """A layer starts: its queued prefetches leave the queue (an active expert among them becomes a
        demand miss; the others are stale), and so do any left for earlier layers."""
        if len(self.prefetch):
            self.sim.metrics.prefetch_dropped += self.prefetch.drop_through(layer)

    def run(self):
        env, sim = self.env, self.sim
        h2d = sim.cost.expert_h2d_seconds()
        while True:
            if self.demand:
                layer, experts, ev = self.demand.popleft()
                yield env.timeout(len(experts) * h2d)
                ev.succeed()
            elif len(self.prefetch):
                nxt = self.prefetch.pop_missing(sim.resmask)
                if nxt is None:
                    continue
                layer, e = nxt
                fwd = self.prefetch_forward
                res = sim.resident[layer]
                if fwd != sim.cur_forward or layer <= sim.cur_layer:
                    sim.metrics.prefetch_dropped += 1
                    continue
                v = -1
                if len(res) >= sim.caps[layer]:
                    v = sim.policy.prefetch_victim(layer, e, frozenset(res), frozenset())
                    if v is None or v not in res:  # no slot: skip it and the rest planned for this layer
                        sim.log("skip", layer, e, -1 if v is None else int(v))
                        sim.metrics.prefetch_dropped += 1 + self.prefetch.drop_layer(layer)
                        continue
                    sim.evict(layer, v)
                sim.log("start", layer, e, int(v))
                ev = env.event()
                self.inflight = (layer, e, ev)
                yield env.timeout(h2d)
                self.inflight = None
                res = sim.resident[layer]  # the layer may have executed (and been re-set) meanwhile
                m = sim.metrics
                if sim.measuring:
                    m.prefetch_copies += 1
                    m.prefetch_bytes += sim.cost.expert_bytes
                    sim.fwd_prefetch += 1
                admitted = bool(len(res) < sim.caps[layer])
                sim.log("done", layer, e, admitted, sim.measuring)
                if admitted:
                    sim.admit(layer, e)
                    sim.policy.on_prefetch_done(layer, e)
                    if sim.decode_forward:
                        sim.record_copies(layer, fwd, (e,))
                else:
                    m.prefetch_wasted += 1
                ev.succeed()
            else:
                self.wake = env.event()
                yield self.wake
                self.wake = None


class Simulation:
    """Replays a list of batched forwards under one policy and cost model."""

    def __init__(self, topology: ModelTopology, policy: Policy, cost: CostModel, cpu_workers: int = 1):
        self.topo, self.policy, self.cost = topology, policy, cost
        self.cpu_workers = max(1, int(cpu_workers))
        L = topology.n_moe_layers
        self.metrics = RunMetrics(L, cost.expert_bytes)
        self.resident = [frozenset() for _ in range(L)]  # experts on the GPU per MoE layer
        self.resmask = np.zeros((L, topology.n_experts), bool)  # mirrors ``resident`` for vector lookups
        self.caps = np.zeros(L, np.int64)
        self._caps_key = None  # (shape, bytes) of the capacities last validated
        # experts copied into each layer during the latest two decode forwards: [(forward, set), (forward, set)]
        self.copied = [[(-1, set()), (-1, set())] for _ in range(L)]
        self.cur_forward, self.cur_layer = -1, -1
        self.measuring, self.decode_forward = False, False
        self.fwd_prefetch = 0
        self.moe_index = {lid: j for j, lid in enumerate(topology.moe_layers)}
        # with record_schedule: every state change the policy's residency sees, in simulated-time order
        # (forward begins, layer reaches and ends, prefetch starts/skips/completions); the GPU replay
        # follows it so that prefetching policies see the same residency there (runtime/replay.py)
        self.schedule: list | None = None
        self._gpu_memo: dict = {}  # (experts, tokens) -> (one grouped call's seconds, its kernels' seconds)
        self._calls_memo: dict = {}  # see _expert_calls
        self._dispatch_s = 0.0  # cost.cpu_dispatch_seconds of the current forward's tokens
        self._cpu_costs = CostHints.from_cost_model(cost).cpu_costs  # CPU seconds of each token count (table)

    def _gpu_call(self, n: int, tokens: int) -> tuple:
        """``cost.grouped_call_seconds(n, tokens)`` (the call, its kernels), memoised (the hot loop asks
        the same few pairs)."""
        key = (n, tokens)
        v = self._gpu_memo.get(key)
        if v is None:
            v = self._gpu_memo[key] = self.cost.grouped_call_seconds(n, tokens)
        return v

    def log(self, *event) -> None:
        if self.schedule is not None:
            self.schedule.append(event)

    # ---- residency ------------------------------------------------------------------------------
    def set_resident(self, j: int, experts) -> None:
        """Layer ``j`` now holds ``experts`` (kept as a frozenset: policies are handed it as is)."""
        new = frozenset(experts)
        row = self.resmask[j]
        row.fill(False)
        if new:
            row[np.fromiter(new, np.int64, len(new))] = True
        self.resident[j] = new

    def record_copies(self, j: int, forward: int, experts) -> None:
        """Remember experts copied into layer ``j`` during decode forward ``forward``."""
        slots = self.copied[j]
        if slots[1][0] != forward:
            slots[0] = slots[1]
            slots[1] = (forward, set())
        slots[1][1].update(experts)

    def admit(self, j: int, e: int) -> None:
        self.resident[j] = self.resident[j] | {e}
        self.resmask[j, e] = True

    def evict(self, j: int, e: int) -> None:
        self.resident[j] = self.resident[j] - {e}
        self.resmask[j, e] = False

    # ---- checks ---------------------------------------------------------------------------------
    def _set_caps(self, force: bool = False):
        """Read the policy's capacities; validate them and trim layers over them when they changed (or
        ``force``: residency was replaced, e.g. by a batch placement)."""
        caps = np.asarray(self.policy.capacities(), np.int64)
        key = (caps.shape, caps.tobytes())
        if key == self._caps_key and not force:  # unchanged: validated, and every layer already fits
            return
        ctx = self.policy.ctx
        if caps.shape != (self.topo.n_moe_layers,) or caps.min() < 0 or caps.max() > self.topo.n_experts:
            raise PolicyError(f"policy '{self.policy.name}' returned invalid capacities {caps.tolist()}")
        if caps.sum() > max(ctx.total_slots, 0):
            raise PolicyError(f"policy '{self.policy.name}' capacities sum to {caps.sum()} > {ctx.total_slots} slots")
        self.caps = caps.copy()  # a copy: a policy updating its array in place is seen as a change next time
        for j in range(len(caps)):
            if len(self.resident[j]) > caps[j]:
                keep = set(self.policy.trim(j, set(self.resident[j]), int(caps[j])))
                if not keep <= self.resident[j] or len(keep) > caps[j]:
                    raise PolicyError(f"policy '{self.policy.name}' trim of layer {j} returned an invalid set")
                self.set_resident(j, keep)
        self._caps_key = key

    # ---- processes ------------------------------------------------------------------------------
    def _expert_calls(self, n_hits: int, hit_tok: int, n_gpu: int, g_tok: int) -> tuple:
        """A layer's grouped GPU calls when ``n_gpu`` copied experts (``g_tok`` pairs) join ``n_hits`` hits
        (``hit_tok`` pairs): (the three calls of :func:`expert_calls_together`, together?, how long the copies
        wait behind the hits' call, the copies' seconds), memoised (layers repeat the same few shapes)."""
        key = (n_hits, hit_tok, n_gpu, g_tok)
        v = self._calls_memo.get(key)
        if v is None:
            calls = (self._gpu_call(n_hits, hit_tok), self._gpu_call(n_gpu, g_tok),
                     self._gpu_call(n_hits + n_gpu, hit_tok + g_tok))
            copies_s = n_gpu * self.cost.expert_h2d_seconds()
            together = expert_calls_together(copies_s, *calls)
            wait_s = 0.0 if together else copies_after_hits_s(calls[0])  # copies issued after the hits' call
            v = self._calls_memo[key] = (calls, together, wait_s, copies_s)
        return v

    def _moe_layer(self, env, engine: CopyEngine, f: BatchedForward, info: ForwardInfo, j: int, ne: float):
        """One MoE layer. When the copy engine is idle and the policy queues no prefetch, nothing
        can interleave with this layer, so its timeline is computed in closed form (the same
        arithmetic as the event path below, which handles the general case) and left in
        ``_pending``, spent by the next timeout."""
        m = self.metrics
        ne += self._pending
        self._pending = 0.0
        fast = engine.inflight is None and not engine.demand and not len(engine.prefetch)  # engine.idle()
        if not fast:
            yield env.timeout(ne)
        t_gate = env.now + (ne if fast else 0.0)
        self.cur_layer = j
        active, tokens = f.routing(j)
        late = 0
        row = self.resmask[j]
        if not fast:
            engine.reach_layer(j)
            inf = engine.inflight
            if inf is not None and inf[0] == j and not row[inf[1]] and f.counts[j, inf[1]]:
                yield inf[2]  # wait for the prefetch already on the wire
                late = int(row[inf[1]])
        sched = self.schedule
        if sched is not None:
            sched.append(("reach", f.index, j))
        res = self.resident[j]
        is_miss = ~row[active]
        missed = active[is_miss]
        missed_tok = tokens[is_miss]
        missed_l, missed_tok_l = missed.tolist(), missed_tok.tolist()
        n_active = len(active)
        n_missed = len(missed_l)
        n_hits = n_active - n_missed
        cap = int(self.caps[j])
        view = LayerView(forward=info, layer=j, ids=f.ids_by_layer[j], weights=f.weights_by_layer[j],
                         active=active, tokens=tokens, resident=res, missed=missed,
                         missed_tokens=missed_tok, capacity=cap)
        t0 = time.perf_counter()
        d = self.policy.decide(view)
        m.policy_wall_s += time.perf_counter() - t0
        m.policy_calls += 1
        g, c, retain = check_decision(self.policy.name, view, d, j, cap, missed_l)

        total_tok = f.n_tokens * self.topo.top_k
        miss_tok = sum(missed_tok_l)
        hit_tok = total_tok - miss_tok
        cpu_end = t_gate
        g_tok = miss_tok
        if c:
            if len(c) <= 8:  # a few CPU experts: look each up (cheaper than a dict of every miss)
                idx = missed_l.index
                c_tok = [missed_tok_l[idx(e)] for e in c]
            else:
                c_tok = list(map(dict(zip(missed_l, missed_tok_l)).__getitem__, c))
            g_tok -= sum(c_tok)
            cpu_end += self._dispatch_s + cpu_makespan(self._cpu_costs(c_tok), self.cpu_workers)
            cpu_end += len(g) * self.cost.cpu_stall_per_copy_s  # the host issues the layer's copies meanwhile
            self._fwd_counts[5] += cpu_end - t_gate
        hit_s = self._gpu_call(n_hits, hit_tok)[0]
        if g:
            # the copied experts run as a second grouped call after the hits once their copies land,
            # unless one call over hits and copies ends sooner (expert_calls_together)
            calls, together, wait_s, copies_s = self._expert_calls(n_hits, hit_tok, len(g), g_tok)
        if fast and d.prefetch is None:
            t = t_gate + hit_s
            if g:
                t = expert_calls_end(t_gate, t_gate + wait_s + copies_s, together, *calls)
            self._pending = (t if t > cpu_end else cpu_end) - env.now  # nothing else runs: spent with the next timeout
        else:
            if fast:
                yield env.timeout(ne)
            t_issue = env.now
            if g and wait_s > 0:
                yield env.timeout(wait_s)
            ev = engine.submit_demand(j, g) if g else None  # demand copies queue ahead of any prefetch
            if d.prefetch is not None:  # the new plan starts now, overlapping this layer's compute
                engine.replace_prefetch(f.index, d.prefetch)
            if ev is not None:
                yield ev
                end = expert_calls_end(t_issue, env.now, together, *calls)
                yield env.timeout(end - env.now)
            elif hit_s:
                yield env.timeout(hit_s)
            if env.now < cpu_end:
                yield env.timeout(cpu_end - env.now)

        decode = f.phase != PREFILL
        measured = self.measuring
        fi = f.index
        slots = self.copied[j]
        if measured and decode:  # effective transfers: copied in the previous forward, hit now
            prev = slots[1][1] if slots[1][0] == fi - 1 else (slots[0][1] if slots[0][0] == fi - 1 else None)
            if prev and n_hits:
                m.effective += len(prev.intersection(active[~is_miss].tolist()))
        if sched is not None:
            sched.append(("end", fi, j))
        if retain != res:
            self.set_resident(j, retain)
        if decode:
            if slots[1][0] != fi:  # record_copies, inlined
                slots[0] = slots[1]
                slots[1] = (fi, set(g))
            else:
                slots[1][1].update(g)
            if measured:
                m.transfers_decode += len(g)
        if measured:
            m.late_prefetch_hits += late
            m.layer(j, n_active, n_hits, cap, len(g), len(c), decode)
        fc = self._fwd_counts
        fc[0] += n_hits
        fc[1] += n_missed
        fc[2] += len(g)
        fc[3] += len(c)
        fc[4] += self._gpu_call(n_active, total_tok)[0]

    def _forwards(self, env, engine: CopyEngine, forwards, knowledge_for_batch, batch_starts: dict):
        cost, topo = self.cost, self.topo
        cur_batch = None
        for f in forwards:
            placed = False
            if f.batch != cur_batch:
                cur_batch = f.batch
                placement = self.policy.begin_batch(knowledge_for_batch(f.batch))
                if placement is not None:
                    for j, s in enumerate(placement):
                        self.set_resident(j, s)
                    placed = True
                batch_starts[f.batch] = env.now
            self.measuring = f.measured
            self.decode_forward = f.phase != PREFILL
            self.cur_forward, self.cur_layer = f.index, -1
            self.fwd_prefetch = 0
            self._fwd_counts = [0, 0, 0, 0, 0.0, 0.0]  # hits, misses, to GPU, to CPU, expert time if all resident, CPU path
            info = ForwardInfo(index=f.index, phase=f.phase, n_tokens=f.n_tokens, prev_confidence=f.prev_confidence,
                               masked=f.masked, block_start=f.block_start, request_ids=tuple(f.decoded))
            t_start = env.now
            self.log("begin", f.index)
            self.policy.begin_forward(info)
            self._set_caps(force=placed)
            pf = self.policy.forward_prefetch(info)
            if pf is not None and len(pf):
                engine.replace_prefetch(f.index, pf)
            self._pending = 0.0  # modelled time not yet spent (dense layers), folded into the next timeout
            ne = cost.non_expert_seconds(f.n_tokens, f.kv_len) + cost.policy_per_layer_s + cost.layer_overhead_s
            self._dispatch_s = cost.cpu_dispatch_seconds(f.n_tokens)
            for lid in range(topo.n_layers):
                j = self.moe_index.get(lid)
                if j is None:
                    self._pending += cost.dense_layer_seconds(f.n_tokens, f.kv_len)
                    if not engine.idle():
                        yield env.timeout(self._pending)
                        self._pending = 0.0
                else:
                    yield from self._moe_layer(env, engine, f, info, j, ne)
            yield env.timeout(self._pending + cost.per_forward_seconds(f.n_tokens))
            if len(engine.prefetch):
                engine.replace_prefetch(f.index, [])  # prefetches never cross forwards
            self.policy.end_forward(info)
            h, mi, g, c, resident_s, cpu_path_s = self._fwd_counts
            nonexpert_s = (len(self.moe_index) * ne + (topo.n_layers - len(self.moe_index))
                           * cost.dense_layer_seconds(f.n_tokens, f.kv_len) + cost.per_forward_seconds(f.n_tokens))
            self.metrics.forward((f.index, f.batch, int(f.phase), f.measured, t_start, env.now - t_start, f.n_tokens,
                                  f.kv_len, sum(f.decoded.values()), h, mi, g, c, self.fwd_prefetch, nonexpert_s,
                                  resident_s, cpu_path_s))

    def run(self, forwards: list[BatchedForward], knowledge_for_batch) -> dict:
        """Run every forward; returns {batch: start time}. Metrics accumulate in ``self.metrics``."""
        env = simpy.Environment()
        if isinstance(self.policy, ClairvoyantPolicy):
            self.policy.bind_future(ActivationOracle(forwards))
        for j, s in enumerate(self.policy.initial_residency()):
            self.set_resident(j, s)
        self._set_caps(force=True)
        engine = CopyEngine(env, self)
        batch_starts: dict = {}
        env.process(self._forwards(env, engine, forwards, knowledge_for_batch, batch_starts))
        env.run()
        return batch_starts
