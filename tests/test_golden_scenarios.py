"""Tiny hand-built traces whose TPOT is computed by hand (costs in round milliseconds).

Per forward: dense layer 0.5 ms, each MoE layer's non-expert part 1 ms, one grouped GPU call 1 ms,
one expert copy 10 ms, one expert on the CPU 2 ms per token, lm-head 0.5 ms.
"""

import pytest

from dllm_offload_sim.policies.base import LayerDecision, Policy
from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.costmodel import CostModel
from tests.simkit import flat_cost, flat_profile, request_from_routing, tiny_topology, write_requests

MS = 1e-3


@pytest.fixture
def one_moe(tmp_path):
    topo = tiny_topology(n_moe=1)
    # prefill routes experts {0,1}; decode forward 1 routes {0,1} again; forward 2 routes {2,3}
    req = request_from_routing(0, [[[[0, 1]]], [[[0, 1]]], [[[2, 3]]]])
    return topo, write_requests(tmp_path / "t", topo, [req])


def test_naive_lru_timeline(one_moe):
    topo, path = one_moe
    r = simulate(path, NaiveLRUPolicy(), 2, flat_cost(topo))
    pf = r.per_forward
    # prefill: 0.5 dense + 1 non-expert + 2 copies x 10 + 1 grouped call + 0.5 = 23 ms
    # decode 1: both resident: 0.5 + 1 + 1 + 0.5 = 3 ms; decode 2: two misses again: 23 ms
    assert pf.duration_s.tolist() == pytest.approx([23 * MS, 3 * MS, 23 * MS])
    assert r.summary["tpot_ms"] == pytest.approx((3 + 23) / 2)
    assert r.summary["ttft_ms"] == pytest.approx(23 + 3)
    assert r.summary["hits"] == 2 and r.summary["demand_copies"] == 4
    # cache utilisation over decode layers: forward 1 has 2/2 slots activated, forward 2 has 0/2
    assert r.summary["cache_util"] == pytest.approx(0.5)


def test_copied_call_issues_ahead_of_its_copies(one_moe):
    """With a kernels-only curve (0.25 ms of each 1 ms call is GPU, 0.75 ms host), the call over the
    copied experts is issued while they copy, and only its kernels follow their arrival."""
    topo, path = one_moe
    r = simulate(path, NaiveLRUPolicy(), 2, flat_cost(topo, gpu_device_s=0.25 * MS))
    # prefill: 0.5 + 1 + 2 x 10 copies, then the 0.25 ms kernels + 0.5 = 22.25 ms; decode 1 (hits only,
    # issued with the GPU idle): 0.5 + 1 + 1 + 0.5 = 3 ms; decode 2 as the prefill
    assert r.per_forward.duration_s.tolist() == pytest.approx([22.25 * MS, 3 * MS, 22.25 * MS])


def test_expert_calls_rule():
    from dllm_offload_sim.schedule.timeline import expert_calls_end, expert_calls_together

    # hits' call 1 ms (0.25 of it kernels), copies' call 1 ms (0.25), one call over all 1.2 ms (0.5)
    hit, copied, both = (1.0, 0.25), (1.0, 0.25), (1.2, 0.5)
    # copies take 5 ms: two calls, copies issued after the hits' call (0.75 ms of host), land at 5.75,
    # end max(1, 0.75 + 0.75, 5.75) + 0.25 = 6.0; one call: copies land at 5, end max(0.7, 5) + 0.5 = 5.5
    assert expert_calls_together(5.0, hit, copied, both)
    assert expert_calls_end(0.0, 5.0, True, hit, copied, both) == pytest.approx(5.5)
    assert expert_calls_end(0.0, 5.75, False, hit, copied, both) == pytest.approx(6.0)
    # a big hits' call, few copies: two calls end at max(1, 0.4, 0.2 + 0.5) + 0.1 = 1.1, one at 0.5 + 0.9 = 1.4
    hit, copied, both = (1.0, 0.8), (0.3, 0.1), (1.2, 0.9)
    assert not expert_calls_together(0.5, hit, copied, both)
    assert expert_calls_end(0.0, 0.7, False, hit, copied, both) == pytest.approx(1.1)
    # without kernels-only times (whole calls are GPU time) nothing waits for the host, and the rule is
    # the earlier one: min(max(hits end, arrival) + copies' call, arrival + call over all)
    hit, copied, both = (1.0, 1.0), (1.0, 1.0), (1.5, 1.5)
    assert not expert_calls_together(0.5, hit, copied, both)  # a tie keeps two calls
    assert expert_calls_end(2.0, 2.5, False, hit, copied, both) == pytest.approx(
        min(max(3.0, 2.5) + 1.0, 2.5 + 1.5)
    )


def test_hits_call_goes_ahead_of_the_copies(tmp_path):
    """A hit and a miss in one layer, kernels 0.25 of each 1 ms call: one call over both after the copy
    (10 ms, then 0.25 ms of kernels) beats the hits' call first (the copy would start 0.75 ms later)."""
    topo = tiny_topology(n_moe=1)
    req = request_from_routing(0, [[[[0, 1]]], [[[0, 2]]]])  # decode: 0 is resident, 2 is copied
    r = simulate(
        write_requests(tmp_path / "t", topo, [req]),
        NaiveLRUPolicy(),
        2,
        flat_cost(topo, gpu_device_s=0.25 * MS),
    )
    # 0.5 dense + 1 non-expert + max(0.75 host, 10 copy) + 0.25 kernels + 0.5 head = 12.25 ms
    assert r.per_forward.duration_s.tolist()[1] == pytest.approx(12.25 * MS)


def test_cpu_call_overhead_is_charged_once_per_cpu_layer(one_moe):
    topo, path = one_moe
    r = simulate(
        path, KTransformersPolicy(placement="uniform"), 1, flat_cost(topo, cpu_call_overhead_s=0.5 * MS)
    )
    # as in the KTransformers timeline below, each decode layer with CPU experts pays 0.5 ms once more
    assert r.per_forward.duration_s.tolist()[1:] == pytest.approx([4.5 * MS, 6.5 * MS])


def test_ktransformers_cpu_timeline(one_moe):
    topo, path = one_moe
    r = simulate(path, KTransformersPolicy(placement="uniform"), 1, flat_cost(topo))
    # expert 0 pinned. decode 1: hit 0 on the GPU (1 ms) || expert 1 on the CPU (2 ms): 0.5+1+2+0.5 = 4 ms
    # decode 2: experts 2 and 3 on the CPU, 2 + 2 ms: 0.5 + 1 + 4 + 0.5 = 6 ms
    assert r.per_forward.duration_s.tolist()[1:] == pytest.approx([4 * MS, 6 * MS])
    assert r.summary["tpot_ms"] == pytest.approx(5.0)
    assert r.summary["h2d_count"] == 0 and r.summary["cpu_experts"] == 4  # prefill 1 + decode 1 + 2


class PrefetchOnce(Policy):
    """At MoE layer 0 of each forward: copy misses on demand and prefetch a fixed (layer, expert) list."""

    name = "prefetch_once"
    prefetches = True

    def __init__(self, plan):
        self.plan = plan

    def decide(self, view):
        retain = set(view.resident) | set(view.missed.tolist())
        retain = set(sorted(retain)[: view.capacity])
        plan = self.plan if view.layer == 0 and view.forward.phase != 0 else None  # decode forwards only
        return LayerDecision(to_gpu=view.missed.tolist(), to_cpu=[], retain=retain, prefetch=plan)

    def prefetch_victim(self, layer, expert, resident, protected):
        return min(resident) if resident else None


def test_prefetch_overlaps_and_demand_goes_first(tmp_path):
    topo = tiny_topology(n_moe=2)
    # one row; prefill touches nothing the decode forward needs at layer 1
    req = request_from_routing(0, [[[[0, 1], [0, 1]]], [[[0, 1], [4, 5]]]])
    path = write_requests(tmp_path / "t", topo, [req])
    r = simulate(path, PrefetchOnce([(1, 4), (1, 5)]), 2, flat_cost(topo))
    pf = r.per_forward
    # decode forward: layer 0 hits {0,1} (1 ms grouped call) while the engine prefetches 4 then 5
    # (10 ms each, starting at the gate, t = 0.5 + 1 = 1.5 ms). Layer 1 starts at 2.5 + 1 = 3.5 ms:
    # expert 4 is in flight (lands at 11.5) -> waited for; expert 5 was queued -> taken as a demand
    # copy: 11.5 + 10 = 21.5; then one grouped call 1 ms -> 22.5; lm-head -> 23.0 ms.
    assert pf.duration_s.iloc[1] == pytest.approx(23 * MS)
    assert r.summary["prefetch_copies"] >= 1 and r.summary["late_prefetch_hits"] == 1


def test_stale_prefetch_is_dropped(tmp_path):
    topo = tiny_topology(n_moe=2)
    req = request_from_routing(0, [[[[0, 1], [0, 1]]], [[[0, 1], [0, 1]]]])
    path = write_requests(tmp_path / "t", topo, [req])
    # a prefetch for layer 0 issued at layer 0 targets a layer already reached: never copied
    r = simulate(path, PrefetchOnce([(0, 6)]), 2, flat_cost(topo))
    assert r.summary["prefetch_copies"] == 0 and r.summary["prefetch_dropped"] >= 1


def test_the_runtimes_host_time_per_prefetch_started_delays_the_next_layer(tmp_path):
    """``runtime.prefetch_start_s``: the runtime starts prefetches on its host between layers, so each one started
    since the last MoE layer delays the next layer's decision by that much."""
    topo = tiny_topology(n_moe=2)
    req = request_from_routing(0, [[[[0, 1], [0, 1]]], [[[0, 1], [4, 5]]]])
    path = write_requests(tmp_path / "t", topo, [req])
    prof = flat_profile(topo, h2d_s=1e-3)
    plain = simulate(path, PrefetchOnce([(1, 4), (1, 5)]), 2, CostModel(prof))
    prof.runtime = {"prefetch_start_s": 2e-3}
    slow = simulate(path, PrefetchOnce([(1, 4), (1, 5)]), 2, CostModel(prof))
    # decode forward: both prefetches (1 ms each) start during layer 0 and land before layer 1 (3.5 ms) in both;
    # two starts x 2 ms delay layer 1, whose experts are then hits either way
    assert plain.per_forward.duration_s.iloc[1] == pytest.approx(5 * MS)
    assert slow.per_forward.duration_s.iloc[1] == pytest.approx(9 * MS)
    assert slow.summary["prefetch_copies"] == plain.summary["prefetch_copies"] == 2
    assert slow.summary["hits"] == plain.summary["hits"]
