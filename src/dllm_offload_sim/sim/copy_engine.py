"""The simulated host-to-device copy engine and its prefetch queue."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.policies.residency import ResidencyDriver
from dllm_offload_sim.schedule.events import PrefetchDone, PrefetchSkip, PrefetchStart


@kernel
def _first_missing(items, pos, resmask):  # pragma: no cover (numba)
    """The index of the first entry of ``items`` [N, 2] from ``pos`` on whose (layer, expert) ``resmask`` does not
    hold; -1 if none."""
    for i in range(pos, items.shape[0]):
        if not resmask[items[i, 0], items[i, 1]]:
            return i
    return -1


class PrefetchQueue:
    """Queued prefetches, best first, as an ``[N, 2]`` array of (layer, expert) read with a cursor."""

    def __init__(self, items=None):
        a = np.asarray(items if items is not None and len(items) else np.zeros((0, 2)), np.int64).reshape(
            -1, 2
        )
        self.items, self.pos = a, 0

    def __len__(self) -> int:
        return len(self.items) - self.pos

    def pop_missing(self, resmask: np.ndarray):
        """Pop the next entry whose expert is not resident yet (skipping resident ones); None if none."""
        if self.pos >= len(self.items):
            return None
        i = _first_missing(self.items, self.pos, resmask)
        if i < 0:
            self.pos = len(self.items)
            return None
        self.pos = i + 1
        return int(self.items[i, 0]), int(self.items[i, 1])

    def drop_layer(self, layer: int) -> int:
        """Drop every pending entry for ``layer``; returns how many."""
        rest = self.items[self.pos :]
        keep = rest[:, 0] != layer
        n = len(rest) - int(keep.sum())
        if n:
            self.items, self.pos = rest[keep], 0
        return n

    def drop_through(self, layer: int) -> int:
        """Drop pending entries for layers <= ``layer`` (reached: stale or now demand); returns how many."""
        rest = self.items[self.pos :]
        keep = rest[:, 0] > layer
        n = len(rest) - int(keep.sum())
        if n:
            self.items, self.pos = rest[keep], 0
        return n


@dataclass
class PrefetchCounts:
    """What the copy engine did with prefetches: copies and bytes in measured forwards, drops and waste in all."""

    copies: int = 0
    bytes: float = 0.0
    dropped: int = 0  # stale or skipped (no victim), never copied
    wasted: int = 0  # copied, but the layer had no room on arrival
    this_forward: int = 0  # measured copies that landed during the current forward


@dataclass(slots=True)
class InflightCopy:
    """The prefetch on the wire: its (layer, expert), and the event that fires once it has landed and been admitted,
    made only when the model waits for it (:meth:`CopyEngine.landing`): an event no one waits for is never
    scheduled."""

    layer: int
    expert: int
    landed: simpy.Event | None = None


@dataclass(frozen=True, slots=True)
class CpuCall:
    """The CPU call a layer's demand copies run beside: when it starts and when it would end alone (seconds)."""

    start_s: float
    end_s: float


class CopyEngine:
    """The host-to-device copy engine: serial copies, demand first, stale prefetches dropped.

    It owns its queues and its prefetch counters. The residency it changes (a prefetch's victim, an arrival)
    goes through the driver; ``log`` records each such change for the GPU replay, and ``on_prefetch_landed``
    (layer, forward the prefetch was planned in, expert) is told of every admitted prefetch. A demand batch beside a
    layer's CPU call shares host memory with it: ``cpu_and_copies`` (``CostModel.cpu_and_copies``) gives both ends.
    """

    def __init__(
        self,
        env: simpy.Environment,
        driver: ResidencyDriver,
        h2d_s: float,
        expert_bytes: int,
        log=None,
        on_prefetch_landed=None,
        cpu_and_copies=None,
    ):
        self.env, self.driver, self.h2d_s, self.expert_bytes = env, driver, h2d_s, expert_bytes
        self.cpu_and_copies = cpu_and_copies
        self.log = log  # None: nothing records the schedule (no event is made)
        self.on_prefetch_landed = on_prefetch_landed or (lambda layer, forward, e: None)
        self.counts = PrefetchCounts()
        self.demand: deque = deque()  # (layer, experts, event)
        self.prefetch = PrefetchQueue()  # planned in forward ``self.prefetch_forward``
        self.prefetch_forward = -1
        self.inflight: InflightCopy | None = None  # the prefetch being copied
        # prefetches started (or skipped for want of a victim) since the model last took them
        self.started = 0
        self.forward, self.layer, self.measuring = -1, -1, False  # where the model is now
        self.wake = None
        env.process(self.run())

    def _poke(self):
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def idle(self) -> bool:
        """Nothing copying and nothing queued."""
        return self.inflight is None and not self.demand and not len(self.prefetch)

    def landing(self) -> simpy.Event:
        """The event that fires when the prefetch in flight has landed (and been admitted, where there is room)."""
        inf = self.inflight
        if inf.landed is None:
            inf.landed = self.env.event()
        return inf.landed

    def begin_forward(self, index: int, measuring: bool) -> None:
        self.forward, self.layer, self.measuring = index, -1, measuring
        self.counts.this_forward = 0

    def submit_demand(self, layer: int, experts: list, beside: CpuCall | None = None) -> simpy.Event:
        """Queue a layer's demand copies ahead of any prefetch; the event fires when the last has landed. Beside the
        layer's CPU call (``beside``) both run slower while the other runs, and the event's value is both ends
        (:class:`~dllm_offload_sim.costmodel.contention.OverlapEnds`); otherwise None."""
        if beside is not None and self.cpu_and_copies is None:
            raise ValueError(
                "CopyEngine.submit_demand: copies beside a CPU call need the engine's cpu_and_copies"
            )
        ev = self.env.event()
        self.demand.append((layer, experts, ev, beside))
        self._poke()
        return ev

    def replace_prefetch(self, forward: int, items) -> None:
        """A re-plan: queued (not yet started) prefetches are replaced by ``items`` ((layer, expert) pairs)."""
        self.counts.dropped += len(self.prefetch)
        self.prefetch = PrefetchQueue(items)
        self.prefetch_forward = forward
        self._poke()

    def take_started(self) -> int:
        """Prefetches started (or skipped) since the last call: the host work the runtime does for them before its
        next layer."""
        n, self.started = self.started, 0
        return n

    def reach_layer(self, layer: int) -> None:
        """A layer starts: its queued prefetches leave the queue (an active expert among them becomes a
        demand miss; the others are stale), and so do any left for earlier layers."""
        self.layer = layer
        if len(self.prefetch):
            self.counts.dropped += self.prefetch.drop_through(layer)

    def run(self):
        env, drv, n = self.env, self.driver, self.counts
        h2d = self.h2d_s
        while True:
            if self.demand:
                layer, experts, ev, beside = self.demand.popleft()
                alone = env.now + len(experts) * h2d
                ends = (
                    None
                    if beside is None
                    else self.cpu_and_copies(beside.start_s, beside.end_s, env.now, alone)
                )
                yield env.timeout((alone if ends is None else ends.copies_end_s) - env.now)
                ev.succeed(ends)
            elif len(self.prefetch):
                nxt = self.prefetch.pop_missing(drv.mask)
                if nxt is None:
                    continue
                layer, e = nxt
                fwd = self.prefetch_forward
                if fwd != self.forward or layer <= self.layer:
                    n.dropped += 1
                    continue
                v = -1
                if not drv.has_room(layer):
                    v = drv.prefetch_victim(layer, e)
                    if (
                        v is None or v not in drv.resident[layer]
                    ):  # no slot: skip it and the rest for this layer
                        if self.log is not None:
                            self.log(PrefetchSkip(layer, e, -1 if v is None else v))
                        self.started += 1
                        n.dropped += 1 + self.prefetch.drop_layer(layer)
                        continue
                    drv.evict(layer, v)
                if self.log is not None:
                    self.log(PrefetchStart(layer, e, v))
                self.started += 1
                inflight = self.inflight = InflightCopy(layer, e)
                yield env.timeout(h2d)
                self.inflight = None
                if self.measuring:
                    n.copies += 1
                    n.bytes += self.expert_bytes
                    n.this_forward += 1
                admitted = bool(
                    drv.has_room(layer)
                )  # the layer may have executed (and been re-set) meanwhile
                if self.log is not None:
                    self.log(PrefetchDone(layer, e, admitted, bool(self.measuring)))
                if admitted:
                    drv.prefetch_arrived(layer, e)
                    self.on_prefetch_landed(layer, fwd, e)
                else:
                    n.wasted += 1
                if inflight.landed is not None:
                    inflight.landed.succeed()
            else:
                self.wake = env.event()
                yield self.wake
                self.wake = None
