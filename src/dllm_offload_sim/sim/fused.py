"""Fused forwards: a whole forward's MoE layers decided in one compiled call, for policies with a layer kernel.

The compiled closed form (:mod:`sim.closed_form`) times a forward's layers at once once they are decided; for a
policy whose decision is itself a compiled kernel, the deciding can be one compiled call too: each layer's routing
read, its misses found against the residency, the policy's kernel run, the residency set to what it retains, and
the layer's counters (hits, copies, CPU experts, the copies an earlier forward made that this one hits) written for
the engine to account. The engine (:meth:`sim.engine.Simulation._forwards_closed`) uses a fused forward where the
policy has one (:func:`fused_forward_of`) and the policy's own ``decide`` otherwise; ``tests/test_closed_form.py``
holds the two to the bit.

Fused policies decide through the kernels and rules their ``decide`` calls: Naive-LRU (``naive_lru_retain``), LRU
(``lru_retain``), LFU (``lfu_retain``), Belady with every miss copied or split as ``clairvoyant_coop`` or
``clairvoyant_model`` split them (``belady_retain``, ``split_misses``, ``model_split``), Belady over one pool of
slots (``shared_belady_layer``), OLED with its ablations (``oled_layer``, ``ladder_retain``), TIDE (``tide_refresh``),
KTransformers without dynamic updates (``KTransformersPolicy.streams``), Fiddler's ``objective: sum``
(``FiddlerPolicy.cpu_wins``) and full residency.
"""

from __future__ import annotations

import numpy as np

from dllm_offload_sim.policies.belady import NEVER, BeladyPolicy, belady_retain, model_split
from dllm_offload_sim.policies.belady_shared import SharedBeladyPolicy, shared_belady_layer
from dllm_offload_sim.policies.dispatch import rounded_tokens, split_misses, split_ratio
from dllm_offload_sim.policies.fiddler import FiddlerPolicy
from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
from dllm_offload_sim.policies.lfu import LFUPolicy, lfu_retain
from dllm_offload_sim.policies.lru import LRUPolicy, lru_retain
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy, naive_lru_retain
from dllm_offload_sim.policies.oled import OLEDPolicy, ladder_retain, oled_layer
from dllm_offload_sim.policies.select import resident_and
from dllm_offload_sim.policies.tide import TIDEPolicy, tide_refresh

# the columns of a fused forward's per-layer counters: activated experts, hits and their routed pairs, experts
# copied on demand and their pairs, experts run on the CPU and their pairs, hits that the previous decode forward
# copied into the layer, and where the layer's CPU experts' token counts start in the forward's ``cpu_tokens``
N_ACTIVE, N_HITS, HIT_PAIRS, N_GPU, GPU_PAIRS, N_CPU, CPU_PAIRS, EFFECTIVE, CPU_AT = range(9)
LAYER_COLUMNS = 9


@kernel
def _routing(forward, j, es, tok, cut, row, copied_in, out):  # pragma: no cover (numba)
    """Layer ``j``'s activated experts, its misses against ``row`` and their tokens; its hits' counters into
    ``out[j]``."""
    c0, c1 = cut[j], cut[j + 1]
    active = es[c0:c1]
    n_miss = 0
    for i in range(c1 - c0):
        n_miss += not row[active[i]]
    missed = np.empty(n_miss, np.int64)
    missed_tokens = np.empty(n_miss, tok.dtype)
    k = hits = hit_pairs = effective = 0
    for i in range(c1 - c0):
        e = active[i]
        if row[e]:
            hits += 1
            hit_pairs += tok[c0 + i]
            effective += copied_in[j, e] == forward - 1
        else:
            missed[k] = e
            missed_tokens[k] = tok[c0 + i]
            k += 1
    out[j, N_ACTIVE] = c1 - c0
    out[j, N_HITS] = hits
    out[j, HIT_PAIRS] = hit_pairs
    out[j, EFFECTIVE] = effective
    return active, missed, missed_tokens


@kernel
def _keep(row, keep):  # pragma: no cover (numba)
    row[:] = False
    for e in keep:
        row[e] = True


@kernel
def _all_copied(j, missed, missed_tokens, decode, forward, copied_in, out):  # pragma: no cover (numba)
    """Layer ``j`` copied every miss (stamped in ``copied_in`` in a decode forward) and ran none on the CPU: its
    counters into ``out[j]``."""
    if decode:
        for e in missed:
            copied_in[j, e] = forward
    out[j, N_GPU] = missed.shape[0]
    out[j, GPU_PAIRS] = missed_tokens.sum()
    out[j, N_CPU] = 0
    out[j, CPU_PAIRS] = 0
    out[j, CPU_AT] = 0


# the retention kernels retain_forward runs (a kind, not a kernel argument: numba cannot cache a kernel that takes one)
RETAIN_NAIVE_LRU, RETAIN_LFU, RETAIN_BELADY, RETAIN_LRU, RETAIN_ALL = range(5)


@kernel
def retain_forward(
    kind, forward, decode, es, tok, cut, mask, caps, key_a, key_b, copied_in, out
):  # pragma: no cover
    """Forward ``forward``'s MoE layers under a policy that copies every miss and keeps, after each layer, what its
    retention kernel picks: ``naive_lru_retain`` (``key_a``, ``key_b``: last use and the use before), ``lfu_retain``
    (activation count and last use), ``lru_retain`` (recency stamps and each layer's clock), ``belady_retain``
    (``key_a``: this forward's next uses) or, for full residency, every resident and copied expert, by ``kind``. Layer
    ``j`` activates ``es[cut[j]:cut[j + 1]]`` with ``tok[...]`` routed pairs each; ``mask`` [L, E] (the residency)
    becomes what each layer retains, and ``copied_in`` [L, E] holds the last decode forward that copied each expert
    into each layer (-1: none), updated in a decode forward. Writes each layer's counters into ``out``
    [L, LAYER_COLUMNS]."""
    for j in range(caps.shape[0]):
        row = mask[j]
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        if kind == RETAIN_NAIVE_LRU:
            keep = naive_lru_retain(active, missed, row, caps[j], key_a[j], key_b[j], forward)
        elif kind == RETAIN_LFU:
            keep = lfu_retain(active, missed, row, caps[j], key_a[j], key_b[j], forward)
        elif kind == RETAIN_LRU:
            keep = lru_retain(active, missed, row, caps[j], key_a[j], key_b[j])
        elif kind == RETAIN_ALL:
            keep = resident_and(row, missed)
        else:
            keep = belady_retain(missed, row, caps[j], key_a[j])
        _keep(row, keep)
        _all_copied(j, missed, missed_tokens, decode, forward, copied_in, out)


@kernel
def shared_belady_forward(
    forward, decode, es, tok, cut, mask, first_cap, next_after, next_from, slots, caps_at, copied_in, out
):  # pragma: no cover (numba)
    """Forward ``forward``'s MoE layers under ``belady_shared``, with the residency ``mask`` [L, E] as its pool (the
    pool and the residency are the same after every layer): each layer's misses copied, then the pool keeps its
    ``slots`` soonest used (``shared_belady_layer``). ``caps_at[j]``: layer ``j``'s capacity as it was decided
    (``first_cap`` for the first layer, what the policy reported; then what the pool held of the layer)."""
    L, E = mask.shape
    for j in range(L):
        row = mask[j]
        if j == 0:
            caps_at[j] = first_cap
        else:
            n = 0
            for e in range(E):
                n += row[e]
            caps_at[j] = n
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        shared_belady_layer(mask, j, row, missed, next_after, next_from, slots)
        _all_copied(j, missed, missed_tokens, decode, forward, copied_in, out)


@kernel
def oled_forward(
    forward,
    decode,
    es,
    tok,
    cut,
    ids,
    weights,
    psi,
    mask,
    caps,
    prio,
    last,
    stats,
    n_bar,
    cpu_s,
    dispatch_s,
    constants,
    coop,
    by_priority,
    copied_in,
    out,
    cpu_tokens,
):  # pragma: no cover (numba)
    """Forward ``forward``'s MoE layers under OLED (as :func:`retain_forward`, with ``ids`` / ``weights`` [L, T, k]
    the routing per layer, ``psi`` the rows' confidence weights, ``caps`` the slots each layer retains within, and the
    policy's state and constants as ``OLEDPolicy.decide`` hands :func:`oled_layer`). The CPU experts' token counts go
    to ``cpu_tokens``, each layer's from ``out[j, CPU_AT]``, in the order the layer lists its CPU experts."""
    at = 0
    for j in range(caps.shape[0]):
        row = mask[j]
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        m = missed.shape[0]
        n_res = 0
        for e in range(row.shape[0]):
            n_res += row[e]
        cap = caps[j]
        res, n_gpu = oled_layer(
            j,
            ids[j],
            weights[j],
            psi,
            active,
            missed,
            missed_tokens,
            prio,
            last,
            stats,
            forward,
            cap,
            n_res,
            row,
            coop and m > 0,
            n_bar,
            cpu_s,
            dispatch_s,
            constants,
        )
        gpu_pairs = cpu_pairs = 0
        out[j, CPU_AT] = at
        c = 0  # the CPU experts res[n_gpu:m] and the misses are both in ascending id order
        for i in range(m):
            if c < m - n_gpu and missed[i] == res[n_gpu + c]:
                cpu_tokens[at] = missed_tokens[i]
                cpu_pairs += missed_tokens[i]
                at += 1
                c += 1
            else:
                gpu_pairs += missed_tokens[i]
        if decode:
            for i in range(n_gpu):
                copied_in[j, res[i]] = forward
        if n_res + n_gpu <= cap:  # every resident stays and the copies join them
            for i in range(n_gpu):
                row[res[i]] = True
        elif by_priority:  # the kernel's retained
            _keep(row, res[m:])
        else:  # the ladder's base: the most recently used of the residents and the copies
            _keep(row, ladder_retain(row, res[:n_gpu], cap, last[j]))
        out[j, N_GPU] = n_gpu
        out[j, GPU_PAIRS] = gpu_pairs
        out[j, N_CPU] = m - n_gpu
        out[j, CPU_PAIRS] = cpu_pairs


@kernel
def _split(
    j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at
):  # pragma: no cover
    """Layer ``j``'s misses split: those marked in ``to_gpu`` copied (stamped in ``copied_in`` in a decode forward),
    the others run on the CPU (their tokens to ``cpu_tokens`` from ``at``, in ascending id order); the layer's
    counters into ``out[j]``; returns where the next layer's CPU tokens start."""
    n_gpu = gpu_pairs = cpu_pairs = 0
    out[j, CPU_AT] = at
    for i in range(missed.shape[0]):
        if to_gpu[i]:
            n_gpu += 1
            gpu_pairs += missed_tokens[i]
            if decode:
                copied_in[j, missed[i]] = forward
        else:
            cpu_tokens[at] = missed_tokens[i]
            cpu_pairs += missed_tokens[i]
            at += 1
    out[j, N_GPU] = n_gpu
    out[j, GPU_PAIRS] = gpu_pairs
    out[j, N_CPU] = missed.shape[0] - n_gpu
    out[j, CPU_PAIRS] = cpu_pairs
    return at


@kernel
def ktransformers_forward(
    forward, decode, stream, es, tok, cut, mask, copied_in, out, cpu_tokens
):  # pragma: no cover
    """Forward ``forward``'s MoE layers under KTransformers without dynamic updates: every miss runs on the CPU, or,
    in a forward that ``stream``s its layers (at least ``gpu_prefill_token_threshold`` tokens), is copied and not
    kept; the residency stays."""
    at = 0
    for j in range(mask.shape[0]):
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, mask[j], copied_in, out)
        to_gpu = np.full(missed.shape[0], stream)
        at = _split(j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at)


@kernel
def tide_forward(
    forward, decode, refresh, es, tok, cut, mask, caps, copied_in, out, cpu_tokens
):  # pragma: no cover
    """Forward ``forward``'s MoE layers under TIDE: between refreshes every miss runs on the CPU; on a ``refresh``
    forward each layer promotes and demotes what ``tide_refresh`` says (the promoted copied and kept), and runs the
    other misses on the CPU."""
    at = 0
    for j in range(mask.shape[0]):
        row = mask[j]
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        to_gpu = np.zeros(missed.shape[0], np.bool_)
        if refresh:
            c0 = cut[j]
            promote, demote = tide_refresh(active, tok[c0 : c0 + active.shape[0]], row, caps[j])
            for e in demote:
                row[e] = False
            for e in promote:
                row[e] = True
                for q in range(missed.shape[0]):
                    if missed[q] == e:
                        to_gpu[q] = True
        at = _split(j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at)


@kernel
def split_forward(
    forward, decode, on_cpu, es, tok, cut, mask, copied_in, out, cpu_tokens
):  # pragma: no cover
    """Forward ``forward``'s MoE layers under a policy that keeps its residency and runs a miss of ``n`` routed
    tokens on the CPU where ``on_cpu[n]`` holds, else copies it and does not keep it (Fiddler's per-expert choice)."""
    at = 0
    for j in range(mask.shape[0]):
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, mask[j], copied_in, out)
        to_gpu = np.empty(missed.shape[0], np.bool_)
        for i in range(missed.shape[0]):
            to_gpu[i] = not on_cpu[missed_tokens[i]]
        at = _split(j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at)


@kernel
def coop_forward(
    forward,
    decode,
    es,
    tok,
    cut,
    token_rows,
    mask,
    caps,
    next_use,
    reuse,
    reuse_total,
    cpu_s,
    dispatch_s,
    h2d,
    workers,
    reuse_weight,
    max_swaps,
    max_shift,
    copied_in,
    out,
    cpu_tokens,
):  # pragma: no cover (numba)
    """Forward ``forward``'s MoE layers under ``clairvoyant_coop``: each layer's misses split by ``split_misses`` with
    the clairvoyant reuse value ``reuse`` [L, E] over the layer's active total ``reuse_total`` [L] as the priority and
    the hardware split at the misses' mean tokens (``cpu_s`` / ``dispatch_s``: CPU seconds by token count), then
    Belady retention over ``next_use`` [L, E] (as ``BeladyPolicy.decide`` with ``dispatch: coop``)."""
    at = 0
    for j in range(caps.shape[0]):
        row = mask[j]
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        m = missed.shape[0]
        to_gpu = np.ones(m, np.bool_)
        if m:
            total_tokens = 0
            for i in range(m):
                total_tokens += missed_tokens[i]
            rho = split_ratio(cpu_s[rounded_tokens(total_tokens / m)], h2d)
            prio = np.empty(m)
            cost = np.empty(m)
            for i in range(m):
                prio[i] = reuse[j, missed[i]] / reuse_total[j]
                cost[i] = cpu_s[missed_tokens[i]]
            to_gpu = split_misses(
                prio,
                cost,
                dispatch_s[token_rows],
                h2d,
                workers,
                rho,
                active.shape[0],
                reuse_weight,
                max_swaps,
                max_shift,
            )
        copied = missed[to_gpu]
        _keep(row, belady_retain(copied, row, caps[j], next_use[j]))
        at = _split(j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at)


@kernel
def model_forward(
    forward,
    decode,
    es,
    tok,
    cut,
    mask,
    caps,
    next_use,
    copied_in,
    out,
    cpu_tokens,
    cpu_s,
    dispatch_s,
    h2d,
    workers,
    curves,
):  # pragma: no cover (numba)
    """Forward ``forward``'s MoE layers under ``clairvoyant_model``: each layer's misses split by ``model_split``
    (its costs, ``cpu_s`` to ``curves``, from ``BeladyPolicy.model_costs``), then Belady retention over ``next_use`` [L, E] (as ``BeladyPolicy.decide`` with ``dispatch: model``)."""
    at = 0
    for j in range(caps.shape[0]):
        row = mask[j]
        active, missed, missed_tokens = _routing(forward, j, es, tok, cut, row, copied_in, out)
        to_gpu = np.ones(missed.shape[0], np.bool_)
        if missed.shape[0]:
            to_gpu = model_split(
                missed,
                missed_tokens,
                next_use[j],
                row,
                caps[j],
                out[j, N_HITS],
                out[j, HIT_PAIRS],
                cpu_s,
                dispatch_s,
                h2d,
                workers,
                curves,
            )
        _keep(row, belady_retain(missed[to_gpu], row, caps[j], next_use[j]))
        at = _split(j, missed, missed_tokens, to_gpu, decode, forward, copied_in, out, cpu_tokens, at)


class FusedForwards:
    """A policy's forwards fused: the state a run's fused forwards keep beside the policy's own (the last decode
    forward that copied each expert into each layer, the per-layer counters, the CPU experts' token counts)."""

    def __init__(self, policy, n_layers: int, n_experts: int):
        self.policy = policy
        self.copied_in = np.full((n_layers, n_experts), -1, np.int64)
        self.out = np.zeros((n_layers, LAYER_COLUMNS), np.int64)
        self.cpu_tokens = np.zeros(0, np.int64)
        # each layer's capacity as it was decided, where a policy's capacities move within a forward (None: the
        # capacities the forward started with)
        self.caps_at = None

    def routing(self, f):
        """Forward ``f``'s routing arrays (``BatchedForward.routing_arrays``), with room for its CPU experts' tokens."""
        es, tok, cut = f.routing_arrays()
        if len(self.cpu_tokens) < len(es):
            self.cpu_tokens = np.zeros(len(es), tok.dtype)
        return es, tok, cut

    def forward(self, f, decode: bool, mask: np.ndarray, caps: np.ndarray) -> np.ndarray:
        """Decide forward ``f``'s MoE layers (``mask``, the residency, updated in place); returns their counters
        ``[L, LAYER_COLUMNS]`` (the CPU experts' tokens in ``cpu_tokens``)."""
        raise NotImplementedError


class FusedRetain(FusedForwards):
    """The forwards of a policy that copies every miss and retains through a retention kernel over two state arrays
    (:func:`retain_forward` of ``kind``): Naive-LRU (last use, the use before), LFU (activation count, last use),
    LRU (recency stamps, each layer's clock) and full residency (neither)."""

    def __init__(
        self, policy, kind: int, key_a: np.ndarray, key_b: np.ndarray, n_layers: int, n_experts: int
    ):
        super().__init__(policy, n_layers, n_experts)
        self.kind, self.key_a, self.key_b = kind, key_a, key_b

    def forward(self, f, decode, mask, caps):
        es, tok, cut = self.routing(f)
        retain_forward(
            self.kind,
            f.index,
            decode,
            es,
            tok,
            cut,
            mask,
            caps,
            self.key_a,
            self.key_b,
            self.copied_in,
            self.out,
        )
        return self.out


class FusedBelady(FusedForwards):
    """Belady's forwards fused (:func:`retain_forward` over this forward's next uses) where every miss is copied
    (``dispatch: gpu``)."""

    def forward(self, f, decode, mask, caps):
        es, tok, cut = self.routing(f)
        next_use = self.policy.oracle.next_uses_all(f.index).astype(np.int64)
        retain_forward(
            RETAIN_BELADY,
            f.index,
            decode,
            es,
            tok,
            cut,
            mask,
            caps,
            next_use,
            next_use,
            self.copied_in,
            self.out,
        )
        return self.out


class FusedCoop(FusedForwards):
    """``clairvoyant_coop``'s forwards fused (:func:`coop_forward`). Each layer's reuse total is summed here, by
    numpy, as the policy's ``decide`` sums it (numpy's pairwise sum, which a compiled loop would not repeat)."""

    def forward(self, f, decode, mask, caps):
        p = self.policy
        es, tok, cut = self.routing(f)
        nx = p.oracle.next_uses_all(f.index)
        nxf = nx.astype(np.float64)
        reuse = np.where(nxf >= NEVER, 0.0, 1.0 / np.maximum(nxf - f.index, 1.0))
        cuts = cut.tolist()
        totals = np.array(
            [float(reuse[j][es[cuts[j] : cuts[j + 1]]].sum()) or 1.0 for j in range(len(caps))], np.float64
        )
        rows = f.ids_by_layer[0].shape[0] if len(f.ids_by_layer) else 0
        costs = p.ctx.costs
        cpu_s, dispatch_s = costs.cost_arrays(max(f.ids_by_layer[0].size if len(f.ids_by_layer) else 0, 1))
        coop_forward(
            f.index,
            decode,
            es,
            tok,
            cut,
            rows,
            mask,
            caps,
            nx.astype(np.int64),
            reuse,
            totals,
            cpu_s,
            dispatch_s,
            costs.expert_h2d_s,
            costs.cpu_workers,
            p.reuse_weight,
            p.max_swaps,
            p.max_shift,
            self.copied_in,
            self.out,
            self.cpu_tokens,
        )
        return self.out


class FusedModel(FusedForwards):
    """``clairvoyant_model``'s forwards fused (:func:`model_forward`)."""

    def forward(self, f, decode, mask, caps):
        p = self.policy
        es, tok, cut = self.routing(f)
        rows = f.ids_by_layer[0].shape[0] if len(f.ids_by_layer) else 0
        model_forward(
            f.index,
            decode,
            es,
            tok,
            cut,
            mask,
            caps,
            p.oracle.next_uses_all(f.index).astype(np.int64),
            self.copied_in,
            self.out,
            self.cpu_tokens,
            *p.model_costs(rows, int(tok.max()) if len(tok) else 0),
        )
        return self.out


class FusedSharedBelady(FusedForwards):
    """``belady_shared``'s forwards fused (:func:`shared_belady_forward`) over the residency as its pool; its
    capacities move with each layer (``caps_at``), and the policy's pool and capacities follow the residency once the
    forward is decided (``SharedBeladyPolicy.pool_decided``)."""

    def __init__(self, policy, n_layers: int, n_experts: int):
        super().__init__(policy, n_layers, n_experts)
        self.caps_at = np.zeros(n_layers, np.int64)

    def forward(self, f, decode, mask, caps):
        p = self.policy
        es, tok, cut = self.routing(f)
        shared_belady_forward(
            f.index,
            decode,
            es,
            tok,
            cut,
            mask,
            int(caps[0]) if len(caps) else 0,
            p.oracle.next_uses_all(f.index),
            p.oracle.next_uses_all(f.index - 1),
            p.ctx.total_slots,
            self.caps_at,
            self.copied_in,
            self.out,
        )
        p.pool_decided(mask)
        return self.out


class FusedOLED(FusedForwards):
    """OLED's forwards fused (:func:`oled_forward`) over its policy object's state."""

    def forward(self, f, decode, mask, caps):
        p = self.policy
        es, tok, cut = self.routing(f)
        ids, weights = f.ids_by_layer, f.weights_by_layer
        cpu_s, dispatch_s, constants = p.layer_inputs(ids[0].size if len(ids) else 0)
        layer_caps = np.array([p.layer_capacity(j, int(c)) for j, c in enumerate(caps)], np.int64)
        oled_forward(
            f.index,
            decode,
            es,
            tok,
            cut,
            ids,
            weights,
            p.row_psi,
            mask,
            layer_caps,
            p.prio,
            p.last,
            p.stats,
            p.n_bar,
            cpu_s,
            dispatch_s,
            constants,
            p.use_coop,
            p.use_priority,
            self.copied_in,
            self.out,
            self.cpu_tokens,
        )
        return self.out


class FusedKTransformers(FusedForwards):
    """KTransformers' forwards fused (:func:`ktransformers_forward`), without its dynamic updates."""

    def forward(self, f, decode, mask, caps):
        es, tok, cut = self.routing(f)
        stream = self.policy.streams(f.n_tokens)
        ktransformers_forward(
            f.index, decode, stream, es, tok, cut, mask, self.copied_in, self.out, self.cpu_tokens
        )
        return self.out


class FusedTIDE(FusedForwards):
    """TIDE's forwards fused (:func:`tide_forward`), refreshing where the policy's ``begin_forward`` says."""

    def forward(self, f, decode, mask, caps):
        es, tok, cut = self.routing(f)
        tide_forward(
            f.index,
            decode,
            self.policy.refresh,
            es,
            tok,
            cut,
            mask,
            caps,
            self.copied_in,
            self.out,
            self.cpu_tokens,
        )
        return self.out


class FusedFiddler(FusedForwards):
    """Fiddler's forwards fused (:func:`split_forward`) with its ``objective: sum`` choice per token count
    (``FiddlerPolicy.cpu_wins``) as an array."""

    def __init__(self, policy, n_layers: int, n_experts: int):
        super().__init__(policy, n_layers, n_experts)
        self.on_cpu = np.zeros(0, np.bool_)

    def _cover(self, n: int) -> None:
        """``on_cpu`` for every token count up to ``n``."""
        have = len(self.on_cpu)
        if n < have:
            return
        more = [self.policy.cpu_wins(t) for t in range(have, max(n + 1, 2 * have))]
        self.on_cpu = np.concatenate([self.on_cpu, np.array(more, np.bool_)])

    def forward(self, f, decode, mask, caps):
        es, tok, cut = self.routing(f)
        self._cover(int(tok.max()) if len(tok) else 0)
        split_forward(
            f.index, decode, self.on_cpu, es, tok, cut, mask, self.copied_in, self.out, self.cpu_tokens
        )
        return self.out


def fused_forward_of(policy, n_layers: int, n_experts: int):
    """The fused forwards of ``policy``, or None where it has none (a subclass may decide otherwise: only the class
    itself qualifies)."""
    if type(policy) is NaiveLRUPolicy:
        return FusedRetain(policy, RETAIN_NAIVE_LRU, policy.last, policy.prev, n_layers, n_experts)
    if type(policy) is LFUPolicy:
        return FusedRetain(policy, RETAIN_LFU, policy.count, policy.last, n_layers, n_experts)
    if type(policy) is LRUPolicy:
        return FusedRetain(policy, RETAIN_LRU, policy.stamp, policy.clock, n_layers, n_experts)
    if type(policy) is FullResidencyPolicy:
        unused = np.zeros((n_layers, n_experts), np.int64)
        return FusedRetain(policy, RETAIN_ALL, unused, unused, n_layers, n_experts)
    if type(policy) is OLEDPolicy:
        return FusedOLED(policy, n_layers, n_experts)
    if type(policy) is SharedBeladyPolicy:
        return FusedSharedBelady(policy, n_layers, n_experts)
    if type(policy) is KTransformersPolicy and not policy.dynamic_update:
        return FusedKTransformers(policy, n_layers, n_experts)
    if type(policy) is TIDEPolicy:
        return FusedTIDE(policy, n_layers, n_experts)
    if type(policy) is BeladyPolicy and policy.dispatch == "gpu":
        return FusedBelady(policy, n_layers, n_experts)
    if type(policy) is BeladyPolicy and policy.dispatch == "coop":
        return FusedCoop(policy, n_layers, n_experts)
    if (
        type(policy) is BeladyPolicy
        and policy.dispatch == "model"
        and policy.ctx.costs.gpu_curves is not None
    ):
        return FusedModel(policy, n_layers, n_experts)
    if type(policy) is FiddlerPolicy and policy.objective == "sum":
        return FusedFiddler(policy, n_layers, n_experts)
    return None
