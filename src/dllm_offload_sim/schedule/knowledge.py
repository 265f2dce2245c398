"""Offline knowledge: what profiling the *other* requests of a trace tells a policy before a batch.

Per request, :func:`request_profile` records its routed-token counts ``[L, E]`` (its EAM) and how many tokens its
decode forwards route to each active expert, eagerly (a few arrays of ``[L, E]``); its per-forward expert maps are
made only when a policy reads them (:class:`ForwardMaps`), since they take ``L x E x 8`` bytes per decode forward
and only trajectory-matching policies (FineMoE) read them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dllm_offload_sim.policies.base import OfflineKnowledge
from dllm_offload_sim.traces.schema import RequestArrays
from dllm_offload_sim.traces.topology import ModelTopology


@dataclass
class RequestProfile:
    """One request as offline profiling sees it: ``eam`` [L, E] routed-token counts over all its forwards;
    over its decode forwards, the routed (token, expert) pairs ``tok_sum`` and the active (layer, expert) pairs
    ``act_n``; ``n_decode`` decode forwards, whose expert ``maps`` are made on first read."""

    request_id: int
    eam: np.ndarray
    tok_sum: float
    act_n: int
    n_decode: int
    maps: list | None = None


def _offsets(topo: ModelTopology) -> np.ndarray:
    return (np.arange(topo.n_moe_layers) * topo.n_experts)[None, :, None]


def request_profile(req: RequestArrays, topo: ModelTopology) -> RequestProfile:
    """:class:`RequestProfile` of ``req`` (its maps not made yet)."""
    L, E = topo.n_moe_layers, topo.n_experts
    offs = _offsets(topo)
    eam = np.bincount((req.ids.astype(np.int64) + offs).ravel(), minlength=L * E).reshape(L, E)
    tok_sum, act_n, n = 0.0, 0, 0
    for s in req.decode_steps():
        c = np.bincount((req.ids[req.rows(s)].astype(np.int64) + offs).ravel(), minlength=L * E)
        tok_sum += c.sum()
        act_n += int((c > 0).sum())
        n += 1
    return RequestProfile(req.request_id, eam, tok_sum, act_n, n)


def request_maps(req: RequestArrays, topo: ModelTopology) -> list:
    """Per decode forward of ``req``: its expert map ``[L, E]``, each layer's summed gate weight per expert
    normalised to sum 1 (a layer that routes nothing stays 0)."""
    L, E = topo.n_moe_layers, topo.n_experts
    offs = _offsets(topo)
    maps = []
    for s in req.decode_steps():
        r = req.rows(s)
        ids = req.ids[r].astype(np.int64) + offs
        w = np.bincount(ids.ravel(), weights=req.weights[r].astype(float).ravel(), minlength=L * E).reshape(
            L, E
        )
        tot = w.sum(1, keepdims=True)
        maps.append(np.divide(w, tot, out=np.zeros_like(w), where=tot > 0))
    return maps


class ForwardMaps(Sequence):
    """The decode forwards' expert maps of ``profiles``, in order, as one sequence; a request's maps are made (from
    ``read(request_id)``) when one of them is first read, and kept in its profile."""

    def __init__(
        self, profiles: list[RequestProfile], read: Callable[[int], RequestArrays], topo: ModelTopology
    ):
        self._profiles, self._read, self._topo = profiles, read, topo
        self._starts = np.cumsum([0] + [p.n_decode for p in profiles]).tolist()

    def __len__(self) -> int:
        return self._starts[-1]

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        q = bisect_right(self._starts, i) - 1
        p = self._profiles[q]
        if p.maps is None:
            p.maps = request_maps(self._read(p.request_id), self._topo)
        return p.maps[i - self._starts[q]]


def combine_knowledge(
    parts: list[RequestProfile], read: Callable[[int], RequestArrays], topo: ModelTopology
) -> OfflineKnowledge:
    """What a policy knows from profiling the requests of ``parts`` (``read`` gives a request's arrays back when its
    expert maps are read)."""
    tok = sum(p.tok_sum for p in parts)
    act = sum(p.act_n for p in parts)
    return OfflineKnowledge(
        request_counts=[p.eam for p in parts],
        forward_maps=ForwardMaps(parts, read, topo),
        mean_tokens_per_active_expert=tok / act if act else float("nan"),
    )
