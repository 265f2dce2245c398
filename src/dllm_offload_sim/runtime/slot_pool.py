"""SlotPool: the GPU expert cache as a fixed arena of expert slots and a (layer, expert) -> slot table."""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np
import torch

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
    """

    def __init__(self, n_slots: int, hidden: int, inter: int, dtype=torch.bfloat16, device="cpu",
                 home: list[tuple[int, int]] | None = None, window: int | None = None):
        if n_slots < 0:
            raise ValueError(f"n_slots must be >= 0, got {n_slots}")
        for j, (a, b) in enumerate(home or []):
            if not 0 <= a <= b <= n_slots:
                raise ValueError(f"home range of layer {j} ({a}, {b}) is outside the {n_slots} slots")
        self.home = list(home) if home else None
        self.window = window
        self.n_slots, self.hidden, self.inter = n_slots, hidden, inter
        self.flat = torch.empty((n_slots, 3 * inter * hidden), dtype=dtype, device=device)
        self.slot_flat = self.flat.unbind(0)  # slot s's contiguous run, a view made once (the copies' destinations)
        self.w13, self.w2 = expert_views(self.flat, hidden, inter)
        self._slot: dict[tuple[int, int], int] = {}
        self._by_layer: dict[int, dict[int, int]] = {}  # layer -> {expert: slot}: O(layer) residency queries
        self._luts: dict[int, np.ndarray] = {}  # layer -> live [n_experts] slot array (see layer_lut)
        self._owner: list[tuple[int, int] | None] = [None] * n_slots
        self._free = list(range(n_slots))  # ascending

    def __len__(self) -> int:
        return len(self._slot)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def lookup(self, layer: int, expert: int) -> int | None:
        return self._slot.get((layer, expert))

    def resident(self, layer: int) -> set[int]:
        return set(self._by_layer.get(layer, ()))

    def assign(self, layer: int, expert: int) -> int:
        """A slot for (layer, expert); the existing one if already resident."""
        key = (layer, expert)
        s = self._slot.get(key)
        if s is not None:
            return s
        if not self._free:
            raise SlotPoolFull(f"all {self.n_slots} slots are taken; release one before assigning ({layer}, {expert})")
        i = 0
        if self.home is not None and layer < len(self.home):
            a, b = self.home[layer]
            i = bisect_left(self._free, a)
            if (i == len(self._free) or self._free[i] >= b) and self.window:  # home full: its window block
                lo = a // self.window * self.window
                i = bisect_left(self._free, lo)
                b = lo + self.window
            if i == len(self._free) or self._free[i] >= b:
                i = 0  # the lowest free slot anywhere
        s = self._free.pop(i)
        self._slot[key] = s
        self._by_layer.setdefault(layer, {})[expert] = s
        lut = self._luts.get(layer)
        if lut is not None:
            lut[expert] = s
        self._owner[s] = key
        return s

    def release(self, layer: int, expert: int) -> int:
        s = self._slot.pop((layer, expert), None)
        if s is None:
            raise KeyError(f"({layer}, {expert}) is not resident")
        del self._by_layer[layer][expert]
        lut = self._luts.get(layer)
        if lut is not None:
            lut[expert] = -1
        self._owner[s] = None
        insort(self._free, s)
        return s

    def set_layer(self, layer: int, experts) -> tuple[list[int], list[int]]:
        """Make ``layer``'s residents exactly ``experts``; returns (released, newly assigned) experts."""
        want = experts if type(experts) is set else {int(e) for e in experts}
        have = self._by_layer.get(layer, {}).keys()
        if len(want) == len(have) and want == have:
            return [], []
        gone = sorted(have - want)
        for e in gone:
            self.release(layer, e)
        new = sorted(want - have)
        for e in new:
            self.assign(layer, e)
        return gone, new

    def layer_lut(self, layer: int, n_experts: int) -> np.ndarray:
        """``[n_experts]`` int64 numpy array, kept up to date by assign/release: the slot of each expert
        of ``layer``, -1 where not resident. Read it, never write it (copy first)."""
        lut = self._luts.get(layer)
        if lut is None:
            lut = self._luts[layer] = np.full(n_experts, -1, np.int64)
            for e, s in self._by_layer.get(layer, {}).items():
                lut[e] = s
        return lut

    def slot_lut(self, layer: int, n_experts: int, device=None) -> torch.Tensor:
        """``[n_experts]`` int64: the slot of each expert of ``layer``, -1 where not resident."""
        lut = torch.full((n_experts,), -1, dtype=torch.int64)
        for e, s in self._by_layer.get(layer, {}).items():
            lut[e] = s
        return lut.to(device) if device is not None else lut

    def check(self) -> None:
        """Internal consistency (used by tests)."""
        assert len(self._slot) + len(self._free) == self.n_slots
        for key, s in self._slot.items():
            assert self._owner[s] == key
            assert self._by_layer[key[0]][key[1]] == s
        assert sum(len(d) for d in self._by_layer.values()) == len(self._slot)
        for layer, lut in self._luts.items():
            assert {int(e): int(lut[e]) for e in np.flatnonzero(lut >= 0)} == self._by_layer.get(layer, {})
        assert len(set(self._free)) == len(self._free) and not set(self._free) & set(self._slot.values())


def layer_homes(n_layers: int, per_layer: int) -> list[tuple[int, int]]:
    """Consecutive home ranges of ``per_layer`` slots, layer 0 first (the rest of an arena is shared)."""
    return [(j * per_layer, (j + 1) * per_layer) for j in range(n_layers)]


def block_layout(n_layers: int, per_layer: int, spill: int, window: int, min_free: int = 0) -> tuple[list, int]:
    """Home ranges of ``per_layer`` slots packed into aligned blocks of ``window`` slots, each block
    keeping ``spill`` slots after its homes for the experts its layers copy beyond their homes, no home
    straddling two blocks; returns (homes, n_slots). So each layer's grouped call stays inside one
    block (one captured graph, ``runtime.grouped_graph``). ``min_free``: at least that many slots
    outside the homes in all (appended at the end if the blocks' spill leaves fewer)."""
    if not 0 <= per_layer <= window:
        raise ValueError(f"a layer's {per_layer} home slots do not fit a window of {window}")
    per_block = n_layers if per_layer == 0 else max(1, min(n_layers, (window - max(spill, 0)) // per_layer))
    homes = [((j // per_block) * window + (j % per_block) * per_layer,
              (j // per_block) * window + (j % per_block + 1) * per_layer) for j in range(n_layers)]
    n_blocks = -(-n_layers // per_block) if n_layers else 1
    in_last = n_layers - (n_blocks - 1) * per_block
    n_slots = (n_blocks - 1) * window + min(window, in_last * per_layer + max(spill, 0))
    return homes, max(n_slots, n_layers * per_layer + min_free)
