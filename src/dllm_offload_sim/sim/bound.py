"""A lower bound on TPOT under the cost model, valid for every policy with the same expert slots.

The bound holds for any policy the engine (:mod:`sim.engine`) can run with ``Cache`` slots per MoE layer on average,
clairvoyant or not, copying, prefetching, retaining or running experts on the CPU as it likes, however it moves
slots between layers. TPOT is the measured decode forwards' duration over the tokens they decode; the bound splits
those forwards into windows of consecutive forwards and bounds each window's duration on its own.

In one window, with ``g_il`` of the ``n_il`` experts forward i activates at MoE layer l computed on the GPU and
``k_il = n_il - g_il`` on the CPU, the forwards last at least

* ``A(g) = sum_i FIXED_i + sum_il X_il(g_il)``: every part the engine charges every policy (each MoE layer's
  non-expert time and host terms, the dense layers, the per-forward work: ``FIXED``), plus each layer's expert time,
  ``X(g) = max(GPU(g) + [k > 0] cpu_issue, CPU(k))``: its GPU path and its CPU path, which run side by side;
* ``B(g) = T_h2d * (sum_il g_il - J - S - 1)``: the copy engine copies one expert at a time, and every expert a layer
  computes on the GPU is resident when the window starts or is copied within it. At the window's start at most
  ``S = Cache x layers`` experts are resident (however a policy shares them between layers) and at most one copy is
  still in flight. The experts the window's layers compute on the GPU number at least ``sum g - J``, ``J`` counting
  each (forward, layer, expert) whose expert an earlier forward of the window activated at that layer too.

Each term under-estimates what the engine charges (docs/policies.md, "The TPOT bound", argues each): ``GPU(g)`` is
the cheaper of one grouped call over ``g`` experts as issued and a hits' call followed by the kernels of a call over
the copied experts, each at the fewest (token, expert) pairs that many of the layer's experts can have; ``CPU(k)`` is
the layer's CPU dispatch plus the call costs of its ``k`` lightest experts over the CPU workers, 0 for ``k = 0``.
The copies' time on the GPU path, host-memory contention, the CPU result's copy and every host cost a policy adds
(prefetch starts, bookkeeping after a CPU call) are left out.

So a window lasts at least ``min_g max(A, B) >= max over lambda in [0, 1] of min_g ((1 - lambda) A + lambda B)``,
which splits by (forward, layer): for each lambda each ``g_il`` is chosen alone. That function of lambda is concave;
a golden-section search finds its maximum. Every partition of the forwards into windows gives a bound; the one
returned is the largest over windows of :data:`WINDOWS` forwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.schedule.batch import BatchedForward, RequestSource, batched_forwards, replay_order
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import PREFILL

GOLDEN_STEPS = 48  # golden-section steps over lambda: the interval shrinks to 0.618^48 ~ 1e-10
WINDOWS = (1, 2, 3, 4, 6, 8, 12, 16)  # window widths tried (forwards); each gives a valid bound


@dataclass(frozen=True)
class TpotBound:
    """A run's TPOT bound: on the measured decode forwards' total duration, over the tokens they decode."""

    tpot_ms: float
    decode_s: float
    decoded: int
    window: int  # the window width whose bound this is (the largest)
    cache: int


class CallTables:
    """The cost model's per-call costs as arrays a compiled kernel reads, grown as larger layers come."""

    def __init__(self, cost: CostModel, n_experts: int):
        self.cost, self.n_experts = cost, n_experts
        self.pairs = 0
        self.cpu_afters, self.cpu_tables = cost.cpu_call_tables()
        self.issued = self.device = np.zeros((n_experts + 1, 1))

    def ensure(self, pairs: int) -> None:
        """Tables for calls of up to ``pairs`` (token, expert) pairs."""
        if pairs <= self.pairs:
            return
        pairs = max(pairs, 2 * self.pairs)
        E = self.n_experts
        issued, device = np.zeros((E + 1, pairs + 1)), np.zeros((E + 1, pairs + 1))
        for a in range(1, E + 1):
            for p in range(a, pairs + 1):  # a call over a experts has at least a pairs
                s0, dev = self.cost.grouped_call_seconds(a, p, False)
                s1, _ = self.cost.grouped_call_seconds(a, p, True)
                issued[a, p], device[a, p] = min(s0, s1), dev
        self.issued, self.device, self.pairs = issued, device, pairs


@kernel
def layer_expert_floor(tok_sorted, issued, device, cpu_afters, cpu_tables, dispatch_s, cpu_issue_s, workers):
    """``X(g)`` for g = 0..n (module docstring) of one MoE layer whose active experts have ``tok_sorted`` tokens
    (ascending)."""
    n = tok_sorted.shape[0]
    minp = np.zeros(n + 1, np.int64)  # the fewest pairs g of the layer's experts can have
    for i in range(n):
        minp[i + 1] = minp[i] + tok_sorted[i]
    gpu = np.empty(n + 1)
    gpu[0] = 0.0
    for g in range(1, n + 1):
        best = issued[g, minp[g]]  # one call over all g (or every GPU expert a hit)
        for a in range(1, g):  # a hits' call, then the kernels of a call over the g - a copied experts
            v = issued[a, minp[a]] + device[g - a, minp[g - a]]
            if v < best:
                best = v
        gpu[g] = best
    out = np.empty(n + 1)
    for g in range(n + 1):
        k = n - g
        if k == 0:
            out[g] = gpu[g]
            continue
        # the k lightest experts in one CPU call, ranked most tokens first: each at its band's cost
        s = 0.0
        for r in range(k):
            t = tok_sorted[k - 1 - r]
            row = 0
            for b in range(cpu_afters.shape[0]):
                if r >= cpu_afters[b]:
                    row = b + 1
            s += cpu_tables[row, t]
        c = dispatch_s + s / workers
        gp = gpu[g] + cpu_issue_s if g > 0 else 0.0
        out[g] = gp if gp > c else c
    return out


@kernel
def window_floor(floors, fl_off, act, act_off, fixed, lo, hi, n_layers, n_experts, h2d_s, slots):
    """The bound on the duration of decode forwards ``lo..hi-1`` together (a window): max over lambda of
    ``(1 - lambda) A + lambda B`` minimised over every layer's ``g`` (module docstring). Forward i's layer j has its
    ``X(g)`` at ``floors[fl_off[i * L + j]:...]`` and its active experts at ``act[act_off[i * L + j]:...]``."""
    # experts a forward of the window activates that an earlier forward of it activated too: the GPU sets' union
    # is at least the sum of their sizes minus these
    seen = np.zeros((n_layers, n_experts), np.bool_)
    shared = 0
    for i in range(lo, hi):
        for j in range(n_layers):
            k = i * n_layers + j
            for q in range(act_off[k], act_off[k + 1]):
                e = act[q]
                if seen[j, e]:
                    shared += 1
                else:
                    seen[j, e] = True
    fixed_sum = 0.0
    for i in range(lo, hi):
        fixed_sum += fixed[i]

    def phi(lam):
        total = (1.0 - lam) * fixed_sum - lam * h2d_s * (slots + 1 + shared)
        for k in range(lo * n_layers, hi * n_layers):
            best = np.inf
            for g in range(fl_off[k + 1] - fl_off[k]):
                v = (1.0 - lam) * floors[fl_off[k] + g] + lam * h2d_s * g
                if v < best:
                    best = v
            total += best
        return total

    a, b = 0.0, 1.0
    r = 0.6180339887498949
    x1, x2 = b - r * (b - a), a + r * (b - a)
    f1, f2 = phi(x1), phi(x2)
    best = max(phi(0.0), phi(1.0))
    for _ in range(GOLDEN_STEPS):
        if f1 < f2:
            a, x1, f1 = x1, x2, f2
            x2 = a + r * (b - a)
            f2 = phi(x2)
        else:
            b, x2, f2 = x2, x1, f1
            x1 = b - r * (b - a)
            f1 = phi(x1)
    return max(best, f1, f2)


@dataclass
class ForwardTerms:
    """One measured decode forward's terms for :func:`window_floor`: per MoE layer ``j`` its ``X(g)`` at
    ``floors[fl_off[j]:fl_off[j + 1]]`` and its active experts at ``act[act_off[j]:act_off[j + 1]]``; its ``FIXED``
    seconds and the tokens it decodes."""

    floors: np.ndarray
    fl_off: np.ndarray
    act: np.ndarray
    act_off: np.ndarray
    fixed: float
    decoded: int


def forward_terms(
    f: BatchedForward, cost: CostModel, tables: CallTables, n_layers: int, cpu_workers: int = 1
) -> ForwardTerms:
    """:class:`ForwardTerms` of forward ``f`` (``n_layers``: the model's layers, dense ones included)."""
    L = f.counts.shape[0]
    ne = cost.non_expert_seconds(f.n_tokens, f.kv_len) + cost.policy_per_layer_s + cost.layer_overhead_s
    fixed = (
        L * ne
        + (n_layers - L) * cost.dense_layer_seconds(f.n_tokens, f.kv_len)
        + cost.per_forward_seconds(f.n_tokens)
        + cost.forward_residual_s
    )
    dispatch = cost.cpu_dispatch_seconds(f.n_tokens)
    floors, fl_off, act, act_off = [], [0], [], [0]
    for j in range(L):
        active, tok = f.routing(j)
        t = np.sort(np.asarray(tok, np.int64))
        tables.ensure(int(t.sum()))
        x = layer_expert_floor(
            t,
            tables.issued,
            tables.device,
            tables.cpu_afters,
            tables.cpu_tables,
            dispatch,
            cost.cpu_issue_s,
            float(max(1, cpu_workers)),
        )
        floors.append(x)
        fl_off.append(fl_off[-1] + len(x))
        act.append(np.asarray(active, np.int64))
        act_off.append(act_off[-1] + len(active))
    return ForwardTerms(
        np.concatenate(floors).astype(np.float64),
        np.asarray(fl_off, np.int64),
        np.concatenate(act).astype(np.int64),
        np.asarray(act_off, np.int64),
        fixed,
        sum(f.decoded.values()),
    )


def window_arrays(terms: list[ForwardTerms]) -> tuple:
    """The flat arrays :func:`window_floor` reads for the window of ``terms`` (its forwards ``0..len(terms) - 1``)."""
    fl_off, act_off, fb, ab = [0], [0], 0, 0
    for t in terms:
        fl_off.extend((t.fl_off[1:] + fb).tolist())
        act_off.extend((t.act_off[1:] + ab).tolist())
        fb, ab = fb + len(t.floors), ab + len(t.act)
    return (
        np.concatenate([t.floors for t in terms]),
        np.asarray(fl_off, np.int64),
        np.concatenate([t.act for t in terms]),
        np.asarray(act_off, np.int64),
        np.asarray([t.fixed for t in terms], np.float64),
    )


def windows_of(run_start: np.ndarray, width: int) -> list[tuple[int, int]]:
    """Consecutive windows of ``width`` forwards (shorter at a run's end) covering every forward once."""
    out, n = [], len(run_start)
    starts = [i for i in range(n) if run_start[i]] + [n]
    for a, b in zip(starts, starts[1:]):
        out += [(lo, min(lo + width, b)) for lo in range(a, b, width)]
    return out


def tpot_bound(
    trace: Trace | str,
    cache: int,
    cost: CostModel,
    requests: list[int] | None = None,
    batch_size: int = 1,
    warmup_requests: int = 0,
    dummy_warmup: bool = False,
    cpu_workers: int = 1,
    widths=WINDOWS,
) -> TpotBound:
    """The TPOT bound of replaying ``trace`` (or its ``requests``) with ``cache`` slots per MoE layer: the forwards and
    the measured ones as :func:`sim.run.simulate` makes them with the same arguments. Each window width of ``widths``
    gives a bound; the largest is returned."""
    if not isinstance(trace, Trace):
        trace = Trace.open(trace)
    topo = trace.topology
    ids = trace.request_ids if requests is None else [int(r) for r in requests]
    order, warmup_requests = replay_order(ids, batch_size, warmup_requests, dummy_warmup)
    reqs = RequestSource(order, trace.request)  # read as their batch is reached
    L, widths = topo.n_moe_layers, [int(w) for w in widths]
    tables = CallTables(cost, topo.n_experts)
    h2d_s, slots = cost.expert_h2d_seconds(), int(cache) * L
    totals = [0.0] * len(widths)  # per width: its windows' bounds added in order
    run: list[
        ForwardTerms
    ] = []  # the current run's last max(widths) forwards (a window never spans two runs)
    n, decoded = 0, 0  # forwards in the current run; tokens decoded

    def add(
        i: int, width: int
    ) -> None:  # the window of the run's last ``width`` forwards, to width i's total
        totals[i] += window_floor(*window_arrays(run[-width:]), 0, width, L, topo.n_experts, h2d_s, slots)

    def end_run() -> (
        None
    ):  # each width's last window of the run, shorter where the run is not a multiple of it
        for i, w in enumerate(widths):
            if n % w:
                add(i, n % w)

    # the forwards are streamed: a window is bounded as its last forward comes, from the windows_of tiling of the run
    for f in batched_forwards(reqs, batch_size, topo.n_experts, warmup_requests):
        if not f.measured or f.phase == PREFILL:
            end_run()
            run, n = [], 0
            continue
        t = forward_terms(f, cost, tables, topo.n_layers, cpu_workers)
        decoded += t.decoded
        run = run[-(max(widths) - 1) :] + [t] if max(widths) > 1 else [t]
        n += 1
        for i, w in enumerate(widths):
            if n % w == 0:
                add(i, w)
    end_run()
    best, best_w = 0.0, 1
    for w, total in zip(widths, totals):
        if total > best:
            best, best_w = total, w
    return TpotBound(1e3 * best / decoded if decoded else float("nan"), best, decoded, best_w, int(cache))
