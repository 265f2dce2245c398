"""The residency driver: runs one policy over a sequence of forwards and owns the residency it decides.

The simulator (``sim/``), the GPU replay (``runtime/replay.py``) and the end-to-end mode
(``validate/e2e.py``) all drive a policy through this one class. It owns what they would otherwise each
write again: the policy's context and setup, the initial and static placements, the capacities (checked,
and layers over them trimmed), the :class:`LayerView` handed to the policy, the check of its answer, the
retention after each layer, prefetch victims and arrivals, and the per-forward counters. A back-end only
copies, computes and times; after a call that changes residency it mirrors the layers the call names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from dllm_offload_sim.policies.base import (
    ClairvoyantPolicy,
    ForwardInfo,
    FutureOracle,
    LayerView,
    OfflineKnowledge,
    Policy,
    PolicyContext,
    PolicyError,
)


@dataclass(slots=True)
class ForwardCounts:
    """What one forward's MoE layers counted, and the seconds its policy spent deciding."""

    hits: int = 0  # activated experts resident at layer start
    misses: int = 0  # activated experts not resident
    to_gpu: int = 0  # misses copied to the GPU on demand
    to_cpu: int = 0  # misses run on the CPU
    # wall time in the policy's hooks (decide, begin/end forward, trims, prefetch hooks)
    policy_s: float = 0.0


@dataclass(slots=True)
class LayerPlan:
    """A policy's checked answer for one MoE layer, with the routing facts it was given."""

    view: LayerView
    is_miss: np.ndarray  # [len(view.active)] bool: the active expert is not resident
    missed: list  # view.missed as a list
    missed_tokens: list  # view.missed_tokens as a list
    to_gpu: list  # missed experts copied on demand
    to_cpu: list  # missed experts run on the CPU
    retain: frozenset | set  # residents after the layer
    prefetch: object = None  # the decision's prefetch plan (None: keep the queue)
    trimmed: tuple = ()  # other layers whose residency the decision shrank (a policy sharing slots between layers)

    @property
    def n_hits(self) -> int:
        return len(self.view.active) - len(self.missed)


def check_decision(name: str, view: LayerView, d, j: int, capacity: int, missed: list):
    """Validate a policy's answer for MoE layer ``j``; returns (to_gpu, to_cpu, retain)."""
    g, c = list(d.to_gpu), list(d.to_cpu)
    if (c or g != missed) and (len(g) + len(c) != len(missed) or sorted(g + c) != sorted(missed)):
        raise PolicyError(
            f"policy '{name}' at forward {view.forward.index}, MoE layer {j}: to_gpu "
            f"and to_cpu must split the {len(missed)} missed experts exactly"
        )
    retain = d.retain if isinstance(d.retain, (set, frozenset)) else set(d.retain)
    if len(retain) > capacity:
        raise PolicyError(f"policy '{name}' retained {len(retain)} experts at layer {j}, capacity {capacity}")
    extra = retain - view.resident
    if extra and not extra <= set(g):
        raise PolicyError(
            f"policy '{name}' retained experts {sorted(extra - set(g))[:5]} at layer {j} "
            f"that are neither resident nor copied"
        )
    return g, c, retain


@dataclass
class ResidencyDriver:
    """Drives ``policy`` (set up here with ``ctx``) and holds the experts resident per MoE layer.

    ``resident[j]`` is a frozenset (policies are handed it as is) mirrored by the boolean row ``mask[j]``
    for vector lookups; ``caps`` are the capacities last checked. ``counts`` are the current forward's.
    """

    policy: Policy
    ctx: PolicyContext
    _resident: list = field(init=False, repr=False)
    mask: np.ndarray = field(init=False)
    caps: np.ndarray = field(init=False)
    counts: ForwardCounts = field(init=False, default_factory=ForwardCounts)
    policy_wall_s: float = field(
        init=False, default=0.0
    )  # in the policy's hooks (decide, begin/end forward, prefetch
    # plan, victims and arrivals: the host runs them all between the GPU's work), over the run
    policy_calls: int = field(init=False, default=0)  # decide calls (MoE layers decided)
    forward_hooks_wall_s: float = field(
        init=False, default=0.0
    )  # of policy_wall_s: the per-forward hooks (begin
    # and end of forward, the capacities checked and trimmed after them, the forward's prefetch plan)

    def __post_init__(self):
        self.policy.setup(self.ctx)
        self.ctx = self.policy.ctx  # a policy may set itself up with another context (full residency)
        L, E = self.ctx.n_layers, self.ctx.n_experts
        self._resident = [frozenset() for _ in range(L)]
        self._stale: set = set()  # layers whose mask row was set directly, their frozenset not yet made again
        self.mask = np.zeros((L, E), bool)
        self.caps = np.zeros(L, np.int64)
        self._caps_key = None  # (shape, bytes) of the capacities last validated
        self._placed = False  # residency was replaced since the capacities were last checked
        self.shares_slots = bool(getattr(self.policy, "shares_slots", False))
        self.prefetches = bool(getattr(self.policy, "prefetches", False))

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def needs_future(self) -> bool:
        """The policy is a clairvoyant bound: :meth:`start` must be handed the run's future."""
        return isinstance(self.policy, ClairvoyantPolicy)

    # ---- residency ------------------------------------------------------------------------------
    @property
    def resident(self) -> list:
        """Per MoE layer, the frozenset of its resident experts (rows set through :meth:`mask_rows_set` made again
        from the mask as this is read)."""
        for j in list(self._stale):
            self.resident_of(j)
        return self._resident

    def resident_of(self, j: int) -> frozenset:
        """``resident[j]``, made again from the mask if its row was set directly (only that row)."""
        if j in self._stale:
            self._resident[j] = frozenset(np.flatnonzero(self.mask[j]).tolist())
            self._stale.discard(j)
        return self._resident[j]

    def mask_rows_set(self, layers) -> None:
        """The ``mask`` rows of ``layers`` were set directly (a compiled decision, ``sim.fused``): their frozensets
        follow when next read, and a policy whose capacities move between layers has them read again."""
        self._stale.update(layers)
        if self.shares_slots:
            self.check_capacities()

    def set_resident(self, j: int, experts) -> None:
        """Layer ``j`` now holds ``experts``."""
        new = frozenset(experts)
        row = self.mask[j]
        row.fill(False)
        if new:
            row[np.fromiter(new, np.int64, len(new))] = True
        self._resident[j] = new
        self._stale.discard(j)

    def admit(self, j: int, e: int) -> None:
        self._resident[j] = self.resident_of(j) | {e}
        self.mask[j, e] = True

    def evict(self, j: int, e: int) -> None:
        self._resident[j] = self.resident_of(j) - {e}
        self.mask[j, e] = False

    def _place(self, placement) -> list[int]:
        for j, s in enumerate(placement):
            self.set_resident(j, s)
        self._placed = True
        return list(range(len(placement)))

    # ---- the run --------------------------------------------------------------------------------
    def start(self, oracle: FutureOracle | None = None) -> list[int]:
        """Before the first forward: hand a clairvoyant policy its future, install the initial residency and
        check the capacities; returns the layers whose residency was set."""
        if isinstance(self.policy, ClairvoyantPolicy):
            if oracle is None:
                raise PolicyError(f"'{self.policy.name}' needs the future routing, and this run has none")
            self.policy.bind_future(oracle)
        layers = self._place(self.policy.initial_residency())
        self.check_capacities()
        return layers

    def begin_batch(self, knowledge: OfflineKnowledge) -> list[int]:
        """A new batch of requests: the policy may place experts statically; returns the layers it set."""
        placement = self.policy.begin_batch(knowledge)
        return [] if placement is None else self._place(placement)

    def begin_forward(self, info: ForwardInfo) -> list[int]:
        """Before a forward's first layer: the policy's hook, then its capacities checked (layers over them
        trimmed); returns the layers whose residency a trim changed. Resets the forward's counters."""
        self.counts = ForwardCounts()
        return self._timed_forward_hook(self._begin_forward, info)

    def _begin_forward(self, info: ForwardInfo) -> list[int]:
        if info.own_confidence is not None and not self.policy.reads_own_confidence:
            info = replace(
                info, own_confidence=None
            )  # a look-ahead only the policies that declare it are handed
        self.policy.begin_forward(info)
        return self.check_capacities(force=self._placed)

    def _timed(self, hook, *args):
        """``hook(*args)``, its wall time counted as the policy's (the forward's and the run's)."""
        t = time.perf_counter()
        out = hook(*args)
        dt = time.perf_counter() - t
        self.counts.policy_s += dt
        self.policy_wall_s += dt
        return out

    def _timed_forward_hook(self, hook, *args):
        """:meth:`_timed`, its wall time also counted in ``forward_hooks_wall_s``."""
        before = self.policy_wall_s
        out = self._timed(hook, *args)
        self.forward_hooks_wall_s += self.policy_wall_s - before
        return out

    def forward_prefetch(self, info: ForwardInfo):
        """The prefetches the policy queues as the forward starts (None or (layer, expert) pairs)."""
        plan = self._timed_forward_hook(self.policy.forward_prefetch, info)
        self._check_prefetches(plan, f"forward {info.index}'s start")
        return plan

    def _check_prefetches(self, plan, where: str) -> None:
        """A policy plans prefetches only if it declares it (``prefetches = True``): a simulator times a run of one that
        does not without its copy engine's events, and the GPU replay issues its copies without the simulator's
        schedule."""
        if plan is not None and len(plan) and not self.prefetches:
            raise PolicyError(
                f"policy '{self.policy.name}' planned {len(plan)} prefetches at {where} but declares prefetches = "
                f"False: set prefetches = True on its class"
            )

    def end_forward(self, info: ForwardInfo) -> ForwardCounts:
        # a policy's per-forward work (FineMoE stores its trajectory here) is decision time too
        self._timed_forward_hook(self.policy.end_forward, info)
        return self.counts

    def check_capacities(self, force: bool = False) -> list[int]:
        """Read the policy's capacities; validate them and trim layers over them when they changed (or
        ``force``: residency was replaced). Returns the layers a trim changed."""
        pol = self.policy
        caps = np.asarray(pol.capacities(), np.int64)
        key = (caps.shape, caps.tobytes())
        if key == self._caps_key and not force:  # unchanged: validated, and every layer already fits
            return []
        L, E = self.ctx.n_layers, self.ctx.n_experts
        if caps.shape != (L,) or caps.min() < 0 or caps.max() > E:
            raise PolicyError(f"policy '{pol.name}' returned invalid capacities {caps.tolist()}")
        if caps.sum() > max(self.ctx.total_slots, 0):
            raise PolicyError(
                f"policy '{pol.name}' capacities sum to {caps.sum()} > {self.ctx.total_slots} slots"
            )
        self.caps = caps.copy()  # a copy: a policy updating its array in place is seen as a change next time
        trimmed = []
        for j in np.flatnonzero(self.mask.sum(1) > caps).tolist():  # the mask counts each layer's residents
            now = self.resident_of(j)
            keep = set(pol.trim(j, set(now), int(caps[j])))
            if not keep <= now or len(keep) > caps[j]:
                raise PolicyError(f"policy '{pol.name}' trim of layer {j} returned an invalid set")
            self.set_resident(j, keep)
            trimmed.append(j)
        self._caps_key = key
        self._placed = False
        return trimmed

    # ---- one MoE layer --------------------------------------------------------------------------
    def decide(
        self,
        info: ForwardInfo,
        j: int,
        ids: np.ndarray,
        weights: np.ndarray,
        active: np.ndarray,
        tokens: np.ndarray,
    ) -> LayerPlan:
        """Hand the policy MoE layer ``j``'s routing (``active`` sorted, ``tokens`` routed to each) and the
        layer's residency; returns its checked answer. Counts the layer's hits, misses and decision time."""
        is_miss = ~self.mask[j][active]
        missed = active[is_miss]
        missed_tok = tokens[is_miss]
        missed_l = missed.tolist()
        cap = int(self.caps[j])
        view = LayerView(
            forward=info,
            layer=j,
            ids=ids,
            weights=weights,
            active=active,
            tokens=tokens,
            resident=self.resident[j],
            missed=missed,
            missed_tokens=missed_tok,
            capacity=cap,
            resident_mask=self.mask[j],
        )
        t0 = time.perf_counter()
        d = self.policy.decide(view)
        self.count_decisions(time.perf_counter() - t0, 1)
        trimmed = ()
        if self.shares_slots:  # its capacities move between layers with each decision: check them now
            trimmed = tuple(t for t in self.check_capacities() if t != j)
            cap = int(self.caps[j])
        g, c, retain = check_decision(self.policy.name, view, d, j, cap, missed_l)
        if d.prefetch is not None and not self.prefetches:
            self._check_prefetches(d.prefetch, f"forward {info.index}, MoE layer {j}")
        self.count_layer(len(active) - len(missed_l), len(g), len(c))
        return LayerPlan(view, is_miss, missed_l, missed_tok.tolist(), g, c, retain, d.prefetch, trimmed)

    def count_decisions(self, seconds: float, layers: int) -> None:
        """The policy decided ``layers`` MoE layers in ``seconds`` of wall time (the forward's and the run's)."""
        self.counts.policy_s += seconds
        self.policy_wall_s += seconds
        self.policy_calls += layers

    def count_layer(self, hits: int, to_gpu: int, to_cpu: int) -> None:
        """A decided MoE layer's hits, and its misses copied in and run on the CPU, in the forward's counters."""
        n = self.counts
        n.hits += hits
        n.misses += to_gpu + to_cpu
        n.to_gpu += to_gpu
        n.to_cpu += to_cpu

    def end_layer(self, j: int, plan: LayerPlan) -> bool:
        """The layer ran: its residents become the policy's retained set, unless that is the set it started
        with (a prefetch admitted while the layer ran then stays). Returns whether residency was set."""
        if plan.retain != plan.view.resident:
            self.set_resident(j, plan.retain)
            return True
        return False

    # ---- prefetches -----------------------------------------------------------------------------
    def prefetch_victim(self, j: int, e: int) -> int | None:
        """The resident the policy evicts so a prefetch of ``e`` fits layer ``j`` (None: skip it)."""
        v = self._timed(self.policy.prefetch_victim, j, e, self.resident[j], frozenset())
        return None if v is None else int(v)

    def has_room(self, j: int) -> bool:
        return len(self.resident[j]) < self.caps[j]

    def prefetch_arrived(self, j: int, e: int) -> None:
        """A prefetched expert landed in a free slot: resident, and the policy is told."""
        self.admit(j, e)
        self._timed(self.policy.on_prefetch_done, j, e)
