"""The policy contract: what an expert-offloading policy sees and what it answers.

A policy is pure decision logic (numpy, Python sets and compiled numba kernels; no timing, no torch). The same object
drives the simulator (modelled time) and the GPU validator (real copies and kernels).

What a deployable policy may know at MoE layer ``l`` of forward ``i`` (docs/policies.md):
the routing of layer ``l`` in forward ``i`` (:class:`LayerView`), everything it saw in earlier calls,
and the token confidence produced by forward ``i-1`` (:class:`ForwardInfo.prev_confidence`). It is
never handed future routing. A policy that sets ``reads_own_confidence`` (OLED's paper-literal
``confidence: current``) is also handed the confidence forward ``i`` itself produces
(:class:`ForwardInfo.own_confidence`): a look-ahead by one forward that a live decode cannot give. Only :class:`ClairvoyantPolicy` subclasses receive a
:class:`FutureOracle`, through :meth:`ClairvoyantPolicy.bind_future`, so a leak is a type error.

Per (forward, MoE layer) a policy answers with a :class:`LayerDecision`: which missed experts are
copied to the GPU and which run on the CPU, what to prefetch for later layers of this forward, and
which experts stay resident after the layer within the layer's capacity.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from dllm_offload_sim.policies.curves import GpuCallCurves
from dllm_offload_sim.traces.topology import ModelTopology


class PolicyError(ValueError):
    """A policy that cannot run with this configuration, or that answered something impossible."""


@dataclass(frozen=True)
class CostHints:
    """Profiled costs a policy may read to decide (the paper's rho uses them); never a clock."""

    expert_h2d_s: float  # copying one expert to the GPU
    cpu_expert_s: Callable[[int], float]  # one expert on the CPU for n tokens
    cpu_dispatch_s: Callable[[int], float]  # sending a layer's activations to the CPU and back
    gpu_experts_s: Callable[[int, float], float]  # one grouped GPU call (experts, tokens per expert)
    cpu_workers: int = 1  # experts the CPU runs at the same time
    cpu_table: tuple = ()  # cpu_expert_s(n) for n = 0..len-1, for fast lookups
    # gpu_experts_s as arrays, for compiled decisions (policies.curves)
    gpu_curves: GpuCallCurves | None = None
    _arrays: dict = field(default_factory=dict, compare=False, repr=False)  # see cost_arrays

    def cost_arrays(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(``cpu_expert_s``, ``cpu_dispatch_s``) of 0, 1, ... tokens as float64 arrays longer than ``n``, for
        compiled kernels that look costs up by token count; made once per power-of-two length."""
        size = 1 << max(int(n), 1).bit_length()
        arrays = self._arrays.get(size)
        if arrays is None:
            arrays = self._arrays[size] = (
                np.array(self.cpu_costs(range(size)), np.float64),
                np.array([self.cpu_dispatch_s(t) for t in range(size)], np.float64),
            )
        return arrays

    def cpu_costs(self, tokens) -> list:
        """``cpu_expert_s`` of each token count (table lookup where possible)."""
        tbl, n = self.cpu_table, len(self.cpu_table)
        if tokens and max(tokens) < n:
            return list(map(tbl.__getitem__, tokens))
        f = self.cpu_expert_s
        return [tbl[t] if t < n else f(t) for t in tokens]

    @classmethod
    def from_cost_model(cls, cm, cpu_workers: int = 1) -> "CostHints":
        return cls(
            cm.expert_h2d_seconds(),
            cm.cpu_expert_seconds,
            cm.cpu_dispatch_seconds,
            cm.gpu_experts_seconds,
            cpu_workers,
            tuple(cm.cpu_table_list),
            cm.gpu_call_curves(),
        )

    @classmethod
    def constant(cls, h2d: float = 1.0, cpu_per_token: float = 0.1, cpu_fixed: float = 0.0) -> "CostHints":
        """Simple linear costs, for tests and examples."""
        return cls(
            h2d, lambda n: cpu_fixed + cpu_per_token * n if n > 0 else 0.0, lambda n: 0.0, lambda e, t: 0.0
        )


@dataclass(frozen=True)
class PolicyContext:
    """Facts fixed for a run: model shape, cache budget, costs, decoding block length."""

    topology: ModelTopology
    cache: int  # GPU expert slots per MoE layer on average (the paper's "Cache")
    costs: CostHints
    block_length: int = 16
    seed: int = 0

    @classmethod
    def of(
        cls,
        topology: ModelTopology,
        cache: int,
        cost_model,
        cpu_workers: int = 1,
        block_length: int = 16,
        seed: int = 0,
    ) -> "PolicyContext":
        """The context of a run timed by ``cost_model`` (a :class:`costmodel.CostModel`)."""
        return cls(
            topology=topology,
            cache=int(cache),
            costs=CostHints.from_cost_model(cost_model, cpu_workers),
            block_length=block_length,
            seed=seed,
        )

    @property
    def n_layers(self) -> int:
        return self.topology.n_moe_layers

    @property
    def n_experts(self) -> int:
        return self.topology.n_experts

    @property
    def total_slots(self) -> int:
        return self.cache * self.topology.n_moe_layers


@dataclass
class OfflineKnowledge:
    """What offline profiling of *other* requests (never the ones replayed) tells a policy."""

    request_counts: list = field(default_factory=list)  # per request: [L, E] routed-token counts
    forward_maps: list = field(
        default_factory=list
    )  # per decode forward: [L, E] gate-weight maps, rows sum to 1
    mean_tokens_per_active_expert: float = float("nan")  # over decode forwards and layers

    @property
    def popularity(self) -> np.ndarray | None:
        """Summed routed-token counts ``[L, E]`` over the profiled requests (None if there are none)."""
        return np.sum(self.request_counts, axis=0) if self.request_counts else None


@dataclass
class ForwardInfo:
    """What is known when a forward starts (before any of its MoE layers)."""

    index: int  # forward number in the run
    phase: int  # traces.schema PREFILL / DENOISE / COMMIT
    n_tokens: int  # routed token rows
    prev_confidence: np.ndarray  # [n_tokens] confidence of forward i-1's output at these rows; NaN if none
    masked: np.ndarray  # [n_tokens] the row is a mask token in this forward's input
    block_start: bool = False  # the forward's rows begin a new block (prefill counts as one)
    request_ids: tuple = ()
    # [n_tokens] this forward's own output confidence; handed only to a policy that reads it
    # (Policy.reads_own_confidence), None otherwise and where the back-end cannot know it
    own_confidence: np.ndarray | None = None


@dataclass(slots=True)
class LayerView:
    """The routing of one MoE layer of the current forward, and the layer's cache state."""

    forward: ForwardInfo
    layer: int  # MoE layer index 0..L-1
    ids: np.ndarray  # [T, k] routed expert ids
    weights: np.ndarray  # [T, k] gate weights
    active: np.ndarray  # sorted activated experts
    tokens: np.ndarray  # tokens routed to each active expert (aligned with ``active``)
    resident: frozenset  # experts of this layer on the GPU at layer start
    missed: np.ndarray  # active experts not resident (sorted)
    missed_tokens: np.ndarray  # tokens routed to each missed expert (aligned with ``missed``)
    capacity: int  # this layer's slots now
    # [E] bool, True where resident (``resident`` as a row; read only)
    resident_mask: np.ndarray | None = None

    def resident_row(self, n_experts: int) -> np.ndarray:
        """``resident_mask``, or for a view built without it, ``resident`` as a row of ``n_experts``."""
        if self.resident_mask is not None:
            return self.resident_mask
        row = np.zeros(n_experts, np.bool_)
        row[list(self.resident)] = True
        return row


@dataclass(slots=True)
class LayerDecision:
    """A policy's answer for one (forward, MoE layer)."""

    to_gpu: Sequence[int]  # missed experts copied to the GPU on demand and computed there
    to_cpu: Sequence[int]  # missed experts computed on the CPU
    retain: frozenset | set  # experts resident after the layer: within resident | to_gpu, at most capacity
    prefetch: Sequence[tuple[int, int]] | np.ndarray | None = None  # (later layer, expert) best first, or an
    # [N, 2] int array of them; replaces the queued prefetches (None: leave the queue as it is)


class FutureOracle(Protocol):
    """Future accesses, for clairvoyant bounds only."""

    def next_use(self, layer: int, expert: int, after_forward: int) -> float:
        """The first forward index > ``after_forward`` activating ``expert`` at ``layer`` (inf if none)."""

    def next_uses(self, layer: int, after_forward: int) -> np.ndarray:
        """``[E]``: :meth:`next_use` of every expert of ``layer`` (int32, its max where never)."""

    def next_uses_all(self, after_forward: int) -> np.ndarray:
        """``[L, E]``: :meth:`next_uses` of every layer."""


class Policy(ABC):
    """Base class: uniform per-layer capacity, an empty cold cache, all-GPU by default."""

    name = "policy"
    needs_slots = True  # False for policies that can run with Cache = 0 (all misses on the CPU)
    prefetches = False  # True if the policy may issue prefetches
    shares_slots = False  # True if its capacities move between layers within a forward (re-read per decision)
    reads_own_confidence = False  # True if it reads ForwardInfo.own_confidence (a look-ahead by one forward)

    def setup(self, ctx: PolicyContext) -> None:
        """Called once per run before anything else."""
        if self.needs_slots and ctx.cache < 1:
            raise PolicyError(
                f"policy '{self.name}' keeps experts on the GPU and needs cache >= 1, got {ctx.cache}"
            )
        if ctx.cache > ctx.n_experts:
            raise PolicyError(f"cache={ctx.cache} exceeds the {ctx.n_experts} experts of a MoE layer")
        if ctx.cache < 0:
            raise PolicyError(f"cache must be >= 0, got {ctx.cache}")
        self.ctx = ctx
        self._caps = np.full(ctx.n_layers, ctx.cache, np.int64)

    def capacities(self) -> np.ndarray:
        """Slots per MoE layer now (the executor enforces them)."""
        return self._caps

    def initial_residency(self) -> list[set]:
        """Experts on the GPU before the first forward (cold by default)."""
        return [set() for _ in range(self.ctx.n_layers)]

    def begin_batch(self, knowledge: OfflineKnowledge) -> list[set] | None:
        """Before a batch of requests: may return a new (static) placement per layer."""
        return None

    def begin_forward(self, fwd: ForwardInfo) -> None:
        """Before a forward's first layer; capacities may change here."""

    @abstractmethod
    def decide(self, view: LayerView) -> LayerDecision:
        """Handle the misses of one MoE layer and say what stays resident after it."""

    def forward_prefetch(self, fwd: ForwardInfo) -> Sequence[tuple[int, int]] | None:
        """Prefetches to queue when a forward starts (before its first MoE layer), best first."""
        return None

    def on_prefetch_done(self, layer: int, expert: int) -> None:
        """A prefetched expert has arrived and is resident."""

    def trim(self, layer: int, resident: set, capacity: int) -> set:
        """Which residents stay when a layer's capacity shrank below its contents."""
        return set(sorted(resident)[:capacity])

    def prefetch_victim(
        self, layer: int, expert: int, resident: frozenset, protected: frozenset
    ) -> int | None:
        """A resident of ``layer`` to evict so a prefetch of ``expert`` fits; None skips it and the rest
        of the current plan's prefetches for ``layer`` (the copy engine asks again only after a re-plan)."""
        return None

    def end_forward(self, fwd: ForwardInfo) -> None:
        """After a forward's last layer."""


class ClairvoyantPolicy(Policy):
    """A bound that is handed the future explicitly; never a deployable policy."""

    def bind_future(self, oracle: FutureOracle) -> None:
        self.oracle = oracle
