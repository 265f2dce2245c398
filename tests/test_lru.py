"""LRU's recency stamps (``policies.lru``) keep the classic per-access LRU of an ordered dictionary."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm_offload_sim.policies.base import CostHints, PolicyContext
from dllm_offload_sim.policies.lru import LRUPolicy, lru_retain
from dllm_offload_sim.policies.residency import ResidencyDriver
from tests.simkit import tiny_topology
from tests.test_residency import info

E = 12
TOPO = tiny_topology(n_moe=2, n_experts=E)


class OrderedDictLRU:
    """The reference: a layer's cache as an ordered dictionary, least recently used first."""

    def __init__(self):
        self.od = OrderedDict()

    def layer(self, active: list, capacity: int) -> set:
        missed = [e for e in active if e not in self.od]
        for e in sorted(set(active) & set(self.od)):
            self.od.move_to_end(e)
        free = max(capacity - len(self.od), 0)
        need = max(len(missed) - free, 0)
        victims = [v for v in self.od if v not in active][:need]
        for v in victims:
            del self.od[v]
        for e in missed[: free + len(victims)]:
            self.od[e] = None
        return set(self.od)

    def trim(self, capacity: int) -> set:
        keep = list(reversed(self.od))[:capacity]
        for e in list(self.od):
            if e not in keep:
                del self.od[e]
        return set(keep)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, E),
    steps=st.lists(
        st.one_of(st.lists(st.integers(0, E - 1), min_size=1, max_size=8), st.integers(0, E)),
        min_size=1,
        max_size=40,
    ),
)
def test_lru_stamps_keep_what_an_ordered_dictionary_keeps(capacity, steps):
    """A layer's accesses (a list of experts) and trims (to an int's slots, once), in any order: the policy through
    the residency driver holds what the ordered-dictionary LRU holds after each."""
    d = ResidencyDriver(LRUPolicy(), PolicyContext(TOPO, capacity, CostHints.constant()))
    d.start()
    ref = OrderedDictLRU()
    for i, step in enumerate(steps):
        if isinstance(step, int):  # both trim the layer to ``step`` slots
            got = d.policy.trim(0, set(d.resident[0]), step)
            d.set_resident(0, got)
            assert got == ref.trim(step)
            continue
        ids = np.asarray(step, np.int64)
        active, tokens = np.unique(ids, return_counts=True)
        plan = d.decide(info(i, len(ids)), 0, ids, np.ones(ids.shape), active, tokens)
        d.end_layer(0, plan)
        assert set(d.resident[0]) == ref.layer(sorted(active.tolist()), capacity), (i, step)


def test_a_resident_with_no_stamp_ranks_least_recent_lower_id_first():
    """Experts placed by someone else (no stamp) are the first victims, lower id first; an expert that left the
    layer loses its stamp."""
    stamp = np.full(E, -1, np.int64)
    clock = np.zeros(1, np.int64)
    row = np.zeros(E, np.bool_)
    row[[3, 5, 7]] = True
    stamp[7] = 4  # the one cached by the policy
    stamp[9] = 2  # left the layer
    keep = lru_retain(np.array([1, 2], np.int64), np.array([1, 2], np.int64), row, 3, stamp, clock)
    assert keep.tolist() == [1, 2, 7]
    assert stamp[9] == -1 and stamp[3] == stamp[5] == -1 and stamp[1] < stamp[2]
