"""SlotPool: the GPU expert cache as a fixed arena of expert slots and a (layer, expert) -> slot table."""

from __future__ import annotations

import numpy as np
import torch

from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.runtime.host_experts import expert_views


class SlotPoolFull(RuntimeError):
    """No free slot left."""


class SlotPool:
    """Decides nothing: holds ``n_slots`` expert-sized GPU buffers and which (layer, expert) sits where.

    ``w13[slot]`` is the expert's fused gate+up projection ``[2*I, H]`` and ``w2[slot]`` its down
    projection ``[H, I]`` (LLaDA2 / vLLM FusedMoE layout), both views of ``flat[slot]`` ``[3*I*H]``: a slot
    is one contiguous run, filled by one copy. Slots are handed out lowest first; with
    ``home`` (a ``(first, end)`` slot range per layer) a layer's experts go to its own range first,
    so that they stay contiguous and one grouped call (at most ``MAX_GROUPS`` consecutive slots)
    covers them; when the range is full, to the lowest free slot of the aligned ``window``-slot block
    that holds the home range (``block_layout`` leaves spare slots there), and only then anywhere.
    The policy decides what to keep, this class only keeps the bookkeeping consistent.

    The bookkeeping is arrays (a free mask over the slots, each slot's owner, a slot table per layer) changed by
    compiled kernels, one call per layer's copies (:meth:`assign_many`) and one per new residency
    (:meth:`set_layer`): the replay's host does this for every MoE layer.
    """

    def __init__(
        self,
        n_slots: int,
        hidden: int,
        inter: int,
        dtype=torch.bfloat16,
        device="cpu",
        home: list[tuple[int, int]] | None = None,
        window: int | None = None,
        n_experts: int = 256,
    ):
        if n_slots < 0:
            raise ValueError(f"n_slots must be >= 0, got {n_slots}")
        for j, (a, b) in enumerate(home or []):
            if not 0 <= a <= b <= n_slots:
                raise ValueError(f"home range of layer {j} ({a}, {b}) is outside the {n_slots} slots")
        self.home = list(home) if home else None
        self.window = window
        self.n_slots, self.hidden, self.inter = n_slots, hidden, inter
        self.flat = torch.empty((n_slots, 3 * inter * hidden), dtype=dtype, device=device)
        self.slot_flat = self.flat.unbind(
            0
        )  # slot s's contiguous run, a view made once (the copies' destinations)
        self.w13, self.w2 = expert_views(self.flat, hidden, inter)
        self._experts = max(int(n_experts), 1)  # slot tables' length (grown if a larger expert id comes)
        self._luts: dict[
            int, np.ndarray
        ] = {}  # layer -> [experts] slot of each expert, -1 where not resident
        self._free = np.ones(n_slots, np.bool_)
        self._owner = np.full((n_slots, 2), -1, np.int64)  # slot -> (layer, expert), -1 where free
        self._ranges: dict[int, np.ndarray] = {}  # layer -> [home first, home end, block first, block end]
        _warm_kernels()

    def __len__(self) -> int:
        return self.n_slots - self.free_slots

    @property
    def free_slots(self) -> int:
        return int(np.count_nonzero(self._free))

    def _lut(self, layer: int, most: int = 0) -> np.ndarray:
        """Layer ``layer``'s slot table, at least ``most`` long (grown in place of the old one: callers re-read it)."""
        lut = self._luts.get(layer)
        if lut is None or len(lut) < most:
            n = max(self._experts, most)
            new = np.full(n, -1, np.int64)
            if lut is not None:
                new[: len(lut)] = lut
            lut = self._luts[layer] = new
            self._experts = n
        return lut

    def _range(self, layer: int) -> np.ndarray:
        """Where ``layer``'s experts go first: its home range, then its window block (empty ranges where none)."""
        r = self._ranges.get(layer)
        if r is None:
            a = b = lo = hi = 0
            if self.home is not None and layer < len(self.home):
                a, b = self.home[layer]
                if self.window:
                    lo = a // self.window * self.window
                    hi = min(lo + self.window, self.n_slots)
            r = self._ranges[layer] = np.array([a, b, lo, hi], np.int64)
        return r

    def lookup(self, layer: int, expert: int) -> int | None:
        lut = self._luts.get(layer)
        if lut is None or not 0 <= expert < len(lut) or lut[expert] < 0:
            return None
        return int(lut[expert])

    def resident(self, layer: int) -> set[int]:
        lut = self._luts.get(layer)
        return set() if lut is None else set(np.flatnonzero(lut >= 0).tolist())

    def assign(self, layer: int, expert: int) -> int:
        """A slot for (layer, expert); the existing one if already resident."""
        return self.assign_many(layer, [expert])[0]

    def assign_many(self, layer: int, experts) -> list[int]:
        """Slots for ``experts`` of ``layer``, in that order: the slots successive :meth:`assign` calls give (a
        resident expert keeps its slot)."""
        e = np.asarray(experts, np.int64).reshape(-1)
        if e.size == 0:
            return []
        lut = self._lut(layer, int(e.max()) + 1)
        out = _assign_kernel(lut, self._free, self._owner, int(layer), e, self._range(layer))
        if out[0] < -1:
            raise SlotPoolFull(
                f"all {self.n_slots} slots are taken; evict one before assigning "
                f"({layer}, {int(e[-out[0] - 2])})"
            )
        return out.tolist()

    def evict(self, layer: int, expert: int) -> int:
        s = self.lookup(layer, expert)
        if s is None:
            raise KeyError(f"({layer}, {expert}) is not resident")
        self._luts[layer][expert] = -1
        self._free[s] = True
        self._owner[s] = -1
        return s

    def set_layer(self, layer: int, experts) -> tuple[list[int], list[int]]:
        """Make ``layer``'s residents exactly ``experts``; returns (evicted, newly assigned) experts."""
        want = (
            np.fromiter(experts, np.int64, len(experts))
            if isinstance(experts, (set, frozenset))
            else np.asarray(list(experts), np.int64).reshape(-1)
        )
        lut = self._lut(layer, int(want.max()) + 1 if want.size else 0)
        gone, new = _set_layer_kernel(lut, self._free, self._owner, int(layer), want, self._range(layer))
        if len(new) and new[0] < 0:
            raise SlotPoolFull(f"layer {layer} needs {len(new)} slots beyond the {self.free_slots} free")
        return gone.tolist(), new.tolist()

    def layer_lut(self, layer: int, n_experts: int) -> np.ndarray:
        """``[n_experts]`` int64 numpy array, kept up to date by assign/evict: the slot of each expert
        of ``layer``, -1 where not resident. Read it, never write it (copy first)."""
        return self._lut(layer, n_experts)[:n_experts]

    def slot_lut(self, layer: int, n_experts: int, device=None) -> torch.Tensor:
        """``[n_experts]`` int64: the slot of each expert of ``layer``, -1 where not resident."""
        lut = torch.from_numpy(self._lut(layer, n_experts)[:n_experts].copy())
        return lut.to(device) if device is not None else lut

    def check(self) -> None:
        """Internal consistency (used by tests)."""
        owned = np.flatnonzero(~self._free)
        assert (self._owner[self._free] == -1).all() and (self._owner[owned] >= 0).all()
        n = 0
        for layer, lut in self._luts.items():
            e = np.flatnonzero(lut >= 0)
            n += len(e)
            assert (self._owner[lut[e], 0] == layer).all() and (self._owner[lut[e], 1] == e).all()
        assert n == len(owned)


def _warm_kernels() -> None:
    """Compile (or load from numba's cache) the pool's kernels for the types the pool calls them with, on a
    throwaway one-slot table, so that no replay's timed forward pays for it."""
    lut, free, owner = np.full(2, -1, np.int64), np.ones(1, np.bool_), np.full((1, 2), -1, np.int64)
    rng = np.zeros(4, np.int64)
    _assign_kernel(lut, free, owner, 0, np.zeros(1, np.int64), rng)
    _set_layer_kernel(lut, free, owner, 0, np.ones(1, np.int64), rng)


@kernel
def _next_free(free, rng, cur):  # pragma: no cover (numba)
    """The lowest free slot at or past the cursors ``cur`` (home range, window block, everywhere; advanced in place),
    as :meth:`SlotPool.assign` orders them; -1 where none is free."""
    a, b, hi = rng[0], rng[1], rng[3]
    while cur[0] < b:
        s = cur[0]
        cur[0] += 1
        if free[s]:
            return s
    while cur[1] < hi:
        s = cur[1]
        cur[1] += 1
        if free[s] and not a <= s < b:
            return s
    n = free.shape[0]
    while cur[2] < n:
        s = cur[2]
        cur[2] += 1
        if free[s]:
            return s
    return -1


@kernel
def _take_slots(lut, free, owner, layer, experts, rng, out):  # pragma: no cover (numba)
    """Give each expert of ``experts`` without a slot in ``lut`` the next free one (``_next_free``), writing every
    expert's slot to ``out``; returns -2 - i where expert ``i`` found none (the slots taken before it stay taken)."""
    cur = np.empty(3, np.int64)
    cur[0], cur[1], cur[2] = rng[0], rng[2], 0
    for i in range(experts.shape[0]):
        e = experts[i]
        s = lut[e]
        if s < 0:
            s = _next_free(free, rng, cur)
            if s < 0:
                return -2 - i
            lut[e] = s
            free[s] = False
            owner[s, 0] = layer
            owner[s, 1] = e
        out[i] = s
    return 0


@kernel
def _assign_kernel(lut, free, owner, layer, experts, rng):  # pragma: no cover (numba)
    """:meth:`SlotPool.assign_many`'s slots (``out[0] < -1``: no free slot for expert ``-out[0] - 2``)."""
    out = np.empty(experts.shape[0], np.int64)
    err = _take_slots(lut, free, owner, layer, experts, rng, out)
    if err < 0:
        out[0] = err
    return out


@kernel
def _set_layer_kernel(lut, free, owner, layer, want, rng):  # pragma: no cover (numba)
    """Evict the residents of ``lut`` not in ``want``, then assign those of ``want`` not resident, ascending;
    returns (evicted, assigned) experts, ascending (assigned ``[-1, ...]`` where the slots ran out)."""
    wanted = np.zeros(lut.shape[0], np.bool_)
    for e in want:
        wanted[e] = True
    n_gone = 0
    n_new = 0
    for e in range(lut.shape[0]):
        if lut[e] >= 0 and not wanted[e]:
            n_gone += 1
        elif lut[e] < 0 and wanted[e]:
            n_new += 1
    gone = np.empty(n_gone, np.int64)
    new = np.empty(n_new, np.int64)
    i = 0
    k = 0
    for e in range(lut.shape[0]):
        if lut[e] >= 0 and not wanted[e]:
            s = lut[e]
            free[s] = True
            owner[s, 0] = -1
            owner[s, 1] = -1
            lut[e] = -1
            gone[i] = e
            i += 1
        elif lut[e] < 0 and wanted[e]:
            new[k] = e
            k += 1
    if n_new:
        slots = np.empty(n_new, np.int64)
        if _take_slots(lut, free, owner, layer, new, rng, slots) < 0:
            new[0] = -1
    return gone, new


def layer_homes(n_layers: int, per_layer: int) -> list[tuple[int, int]]:
    """Consecutive home ranges of ``per_layer`` slots, layer 0 first (the rest of an arena is shared)."""
    return [(j * per_layer, (j + 1) * per_layer) for j in range(n_layers)]


def block_layout(
    n_layers: int, per_layer: int, spill: int, window: int, min_free: int = 0
) -> tuple[list, int]:
    """Home ranges of ``per_layer`` slots packed into aligned blocks of ``window`` slots, each block
    keeping ``spill`` slots after its homes for the experts its layers copy beyond their homes, no home
    straddling two blocks; returns (homes, n_slots). So each layer's grouped call stays inside one
    block (one captured graph, ``runtime.grouped_graph``). ``min_free``: at least that many slots
    outside the homes in all (appended at the end if the blocks' spill leaves fewer)."""
    if not 0 <= per_layer <= window:
        raise ValueError(f"a layer's {per_layer} home slots do not fit a window of {window}")
    per_block = n_layers if per_layer == 0 else max(1, min(n_layers, (window - max(spill, 0)) // per_layer))
    homes = [
        (
            (j // per_block) * window + (j % per_block) * per_layer,
            (j // per_block) * window + (j % per_block + 1) * per_layer,
        )
        for j in range(n_layers)
    ]
    n_blocks = -(-n_layers // per_block) if n_layers else 1
    in_last = n_layers - (n_blocks - 1) * per_block
    n_slots = (n_blocks - 1) * window + min(window, in_last * per_layer + max(spill, 0))
    return homes, max(n_slots, n_layers * per_layer + min_free)
