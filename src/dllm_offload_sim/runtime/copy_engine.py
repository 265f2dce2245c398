"""The H2D copy engine of the runtime: expert copies on a dedicated stream, demand before prefetch.

CUDA executes a stream's work in submission order, so priorities live on the host: demand copies
are submitted at once; a queued prefetch is submitted only when the copy stream is idle, so a
demand copy never waits behind more than the one prefetch already on the wire. Prefetches for a
layer already reached are dropped. Same semantics as the simulator's ``CopyEngine``.
"""

from __future__ import annotations

from collections import deque

import torch

from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool


COPIES_PER_EXPERT = 1  # an expert is one contiguous run (HostExperts.flat) copied into one slot (SlotPool.flat)


class ExpertCopier:
    """Copies experts from :class:`HostExperts` into :class:`SlotPool` slots on a copy stream."""

    def __init__(self, host: HostExperts, pool: SlotPool, device):
        self.host, self.pool = host, pool
        self.cuda = torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
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
        slot, expert = self.pool.slot_flat, self.host.expert_flat
        dsts, srcs = [slot[s] for s in slots], [expert(layer, e) for e in experts]
        if self.cuda:
            with torch.cuda.stream(self.stream):
                torch._foreach_copy_(dsts, srcs, non_blocking=True)
        else:
            torch._foreach_copy_(dsts, srcs)
        self.copied += len(dsts)
        return self._event()

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
