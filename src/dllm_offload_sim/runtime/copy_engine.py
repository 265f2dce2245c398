"""The H2D copy engine of the runtime: expert copies on a dedicated stream, demand before prefetch.

CUDA executes a stream's work in submission order, so priorities live on the host: demand copies
are submitted at once; a queued prefetch is submitted only when the copy stream is idle, so a
demand copy never waits behind more than the one prefetch already on the wire. Prefetches for a
layer already reached are dropped. Same semantics as the simulator's ``CopyEngine``.
"""

from __future__ import annotations

import warnings
from collections import deque

import numpy as np
import torch

from dllm_offload_sim.runtime.cuda_copies import batch_copier
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool


# an expert is one contiguous run (HostExperts.flat) copied into one slot (SlotPool.flat)
COPIES_PER_EXPERT = 1


class ExpertCopier:
    """Copies experts from :class:`HostExperts` into :class:`SlotPool` slots on a copy stream."""

    def __init__(self, host: HostExperts, pool: SlotPool, device, batch: bool = True):
        """``batch``: issue a call's copies through ``cudaMemcpyBatchAsync`` (:mod:`runtime.cuda_copies`) where the
        host experts are pinned and the CUDA runtime has it, else one torch copy each."""
        self.host, self.pool = host, pool
        self.cuda = torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        self._stream_handle = self.stream.cuda_stream if self.cuda else 0
        self._nbytes = host.expert_bytes
        flat_runs = (
            host.flat.is_contiguous()
            and pool.flat.is_contiguous()
            and pool.flat.shape[1] * pool.flat.element_size() == self._nbytes
        )
        self.batch = (
            batch_copier(device) if batch and self.cuda and host.flat.is_pinned() and flat_runs else None
        )
        self.prefetch: deque = deque()  # (layer, expert)
        self.inflight = None  # (layer, expert, event) of the prefetch on the wire
        self.copied = 0

    def _event(self):
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def demand(self, layer: int, experts, slots) -> "torch.cuda.Event | None":
        """Copy ``experts`` of ``layer`` into ``slots`` now, one copy each issued in one call; returns an event
        the compute stream waits on."""
        if not experts:
            return self._event()
        if self.batch is not None:
            try:
                self.batch.copy(*self.addresses(layer, experts, slots), self._nbytes, self._stream_handle)
                self.copied += len(experts)
                return self._event()
            except RuntimeError as e:  # a failed batch: its copies through torch, and every later call's too
                warnings.warn(
                    f"{e}: expert copies go through torch from now on", RuntimeWarning, stacklevel=2
                )
                self.batch = None
        slot, expert = self.pool.slot_flat, self.host.expert_flat
        dsts, srcs = [slot[s] for s in slots], [expert(layer, e) for e in experts]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                torch._foreach_copy_(dsts, srcs, non_blocking=True)
        else:
            torch._foreach_copy_(dsts, srcs)
        self.copied += len(experts)
        return self._event()

    def addresses(self, layer: int, experts, slots) -> tuple[np.ndarray, np.ndarray]:
        """(slot addresses, host addresses) of copying ``experts`` of ``layer`` into ``slots``: uint64 arrays, the
        same places as ``pool.slot_flat[s]`` and ``host.expert_flat(layer, e)``."""
        nb = np.uint64(self._nbytes)
        row = (layer % self.host.n_real) * self.host.flat.shape[1]
        src = np.uint64(self.host.flat.data_ptr()) + (np.uint64(row) + np.asarray(experts, np.uint64)) * nb
        dst = np.uint64(self.pool.flat.data_ptr()) + np.asarray(slots, np.uint64) * nb
        return dst, src

    def prefetch_now(self, layer: int, e: int, slot: int) -> "torch.cuda.Event | None":
        """Copy one prefetched expert into ``slot`` now (behind whatever the copy stream holds);
        returns the event its first user waits on."""
        return self.demand(layer, [e], [slot])

    def replace_prefetch(self, items) -> None:
        self.prefetch = deque((int(l), int(e)) for l, e in items)

    def pump(self, current_layer: int, assign_slot) -> None:
        """Submit the next useful prefetch if the copy stream is idle. ``assign_slot(layer, e)`` gives a
        slot (evicting per the policy) or None to skip."""
        if self.inflight is not None:
            if self.inflight[2] is not None and not self.inflight[2].query():
                return
            self.inflight = None
        while self.prefetch:
            layer, e = self.prefetch.popleft()
            if layer <= current_layer or self.pool.lookup(layer, e) is not None:
                continue  # stale, or already there
            slot = assign_slot(layer, e)
            if slot is None:
                continue
            self.inflight = (layer, e, self.demand(layer, [e], [slot]))
            return

    def wait_inflight(self, layer: int, experts) -> bool:
        """If the prefetch on the wire is one of ``experts`` at ``layer``, make the compute stream wait for it."""
        if self.inflight and self.inflight[0] == layer and self.inflight[1] in experts:
            if self.inflight[2] is not None:
                torch.cuda.current_stream().wait_event(self.inflight[2])
            return True
        return False
