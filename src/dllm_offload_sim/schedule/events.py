"""The simulator's schedule: every change of residency a prefetching policy's run sees, in simulated-time order, as
typed events. The simulator records them (``simulate(..., record_schedule=True)``) and the GPU replay follows them,
so that a prefetching policy sees the same residency on the GPU and every counter agrees.

Markers (:class:`ForwardBegin`, :class:`LayerReach`, :class:`LayerEnd`) are the points both runs pass in the same
order; between two markers the replay applies the prefetch events (:class:`PrefetchSkip`, :class:`PrefetchStart`,
:class:`PrefetchDone`) the simulation logged there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ForwardBegin:
    forward: int


@dataclass(frozen=True)
class LayerReach:
    """MoE layer ``layer`` (its index among the MoE layers) of ``forward`` is about to decide."""

    forward: int
    layer: int


@dataclass(frozen=True)
class LayerEnd:
    forward: int
    layer: int


@dataclass(frozen=True)
class PrefetchSkip:
    """A planned prefetch of expert ``expert`` into ``layer`` found no slot: the policy's victim (``victim``, -1
    for none) was not resident, so it and the rest of the layer's plan were dropped."""

    layer: int
    expert: int
    victim: int


@dataclass(frozen=True)
class PrefetchStart:
    """A prefetch of ``expert`` into ``layer`` started, evicting ``victim`` (-1: a free slot)."""

    layer: int
    expert: int
    victim: int


@dataclass(frozen=True)
class PrefetchDone:
    """The prefetch landed; ``admitted`` if the layer still had room for it, ``measuring`` if it counts."""

    layer: int
    expert: int
    admitted: bool
    measuring: bool


Marker = ForwardBegin | LayerReach | LayerEnd
ScheduleEvent = Marker | PrefetchSkip | PrefetchStart | PrefetchDone
