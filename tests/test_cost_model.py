"""Cost model: interpolation, the H2D fit, bandwidth override, and profile validation."""

import json

import pytest

from dllm_offload_sim.costmodel.cost_model import CostModel, fit_h2d
from dllm_offload_sim.costmodel.profile import ProfileError, load_profile, shipped_profiles
from tests.simkit import flat_profile, tiny_topology


def test_h2d_fit_recovers_latency_and_bandwidth():
    lat, bw = fit_h2d([1e6, 2e6, 4e6], [5e-6 + 1e6 / 50e9, 5e-6 + 2e6 / 50e9, 5e-6 + 4e6 / 50e9])
    assert lat == pytest.approx(5e-6) and bw == pytest.approx(50e9)


def test_pcie_override_scales_only_the_bandwidth_term():
    cm = CostModel("h200-mini")
    slow = CostModel("h200-mini", pcie_gbps=16)
    eb = cm.expert_bytes
    # one latency per copy of an expert and its bytes at the overridden bandwidth
    assert slow.expert_h2d_seconds() == pytest.approx(cm.copies_per_expert * cm.h2d_latency_s + eb / 16e9)
    # the shipped profile's runtime copies an expert in one operation: one latency, as one copy of its bytes
    assert cm.copies_per_expert == 1 and cm.expert_h2d_seconds() == pytest.approx(cm.h2d_seconds(eb))
    assert cm.describe()["status"] == "measured"  # the shipped H200 mini profile is measured


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_non_positive_bandwidth_is_refused(bad):
    with pytest.raises(ProfileError, match="hw.pcie_gbps"):
        CostModel("h200-mini", pcie_gbps=bad)


def test_interpolation_and_extrapolation():
    topo = tiny_topology()
    cm = CostModel(flat_profile(topo, cpu_per_token_s=2e-3))
    assert cm.cpu_expert_seconds(1) == pytest.approx(2e-3)
    assert cm.cpu_expert_seconds(512) == pytest.approx(1.024)  # between profiled points: linear
    assert cm.cpu_expert_seconds(4096) == pytest.approx(8.192)  # beyond: last slope continues
    assert cm.cpu_expert_seconds(20000) == pytest.approx(40.0)  # beyond the lookup table too
    assert cm.gpu_experts_seconds(0, 1) == 0.0
    assert cm.gpu_experts_seconds(300, 4) == pytest.approx(1e-3)  # flat curve stays flat


def test_every_shipped_profile_loads():
    names = [p.name for p in shipped_profiles()]
    assert "h200-mini.estimated.json" in names and "h200-flash.estimated.json" in names
    for p in shipped_profiles():
        prof = load_profile(p)
        assert prof.status in ("measured", "estimated")
        CostModel(prof)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(schema_version=7), "schema_version"),
        (lambda d: d.update(status="guessed"), "status"),
        (lambda d: d["stamp"].pop("gpu"), "stamp.gpu"),
        (lambda d: d["h2d"].update(seconds=[1.0]), "h2d.seconds"),
        (lambda d: d["cpu_expert"].update(tokens=[4, 2]), "cpu_expert.tokens"),
        (lambda d: d["non_expert"]["seconds"][0].__setitem__(0, -1.0), "non_expert.seconds"),
        (lambda d: d.pop("per_forward"), "per_forward"),
    ],
)
def test_bad_profile_names_file_and_field(tmp_path, mutate, field):
    d = json.loads(next(p for p in shipped_profiles() if p.name.startswith("h200-mini")).read_text())
    mutate(d)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(d))
    with pytest.raises(ProfileError) as e:
        load_profile(f)
    assert str(f) in str(e.value) and field in str(e.value)


def test_unknown_shipped_profile():
    with pytest.raises(ProfileError, match="no shipped profile named 'tpu-mini'"):
        load_profile("tpu-mini")


def test_policy_decision_time_can_be_charged(tmp_path):
    from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
    from dllm_offload_sim.sim.run import simulate
    from tests.simkit import flat_profile, request_from_routing, tiny_topology, write_requests

    topo = tiny_topology()
    path = write_requests(
        tmp_path / "t", topo, [request_from_routing(0, [[[[0, 1]]], [[[0, 1]]], [[[0, 1]]]])]
    )
    base = simulate(path, NaiveLRUPolicy(), 2, CostModel(flat_profile(topo))).summary["tpot_ms"]
    charged = simulate(
        path, NaiveLRUPolicy(), 2, CostModel(flat_profile(topo), policy_us_per_layer=500)
    ).summary["tpot_ms"]
    assert charged == pytest.approx(base + 0.5)  # one MoE layer per forward, one token per forward
    with pytest.raises(ProfileError, match="policy_us_per_layer"):
        CostModel(flat_profile(topo), policy_us_per_layer=-1)


def test_with_policy_time_charges_a_decision_per_layer_without_touching_the_original():
    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.costmodel.profile import ProfileError

    cm = CostModel("h200-mini")
    c2 = cm.with_policy_time(120.0)
    assert c2.policy_per_layer_s == pytest.approx(120e-6) and cm.policy_per_layer_s == 0.0
    assert c2.expert_h2d_seconds() == cm.expert_h2d_seconds()
    with pytest.raises(ProfileError, match="policy_us_per_layer"):
        cm.with_policy_time(-1.0)


def test_kernel_time_and_cpu_call_overhead_are_optional_and_read():
    topo = tiny_topology()
    plain = CostModel(flat_profile(topo, gpu_s=1e-3, dispatch_s=1e-4))
    assert plain.gpu_experts_device_seconds(4, 2) == plain.gpu_experts_seconds(4, 2) == pytest.approx(1e-3)
    assert plain.cpu_dispatch_seconds(8) == pytest.approx(1e-4)  # no call overhead in the profile
    cm = CostModel(
        flat_profile(topo, gpu_s=1e-3, gpu_device_s=3e-4, dispatch_s=1e-4, cpu_call_overhead_s=2e-4)
    )
    assert cm.grouped_call_seconds(4, 8) == (pytest.approx(1e-3), pytest.approx(3e-4))
    assert cm.grouped_call_seconds(0, 0) == (0.0, 0.0)
    assert cm.cpu_dispatch_seconds(8) == pytest.approx(3e-4)  # once per CPU layer: dispatch + call overhead


def _banded(topo, bands):
    d = flat_profile(topo, cpu_per_token_s=1e-3).to_dict()  # 1 ms per token, for each of the first experts
    d["cpu_expert"]["bands"] = bands
    return d


def test_a_large_cpu_calls_later_experts_cost_their_bands(tmp_path):
    """A parallel CPU engine runs a large call's experts side by side: with ``cpu_expert.bands`` the experts beyond a
    band's ``after``, by tokens (most first), cost the band's curve; the first ones and small calls the base curve."""
    topo = tiny_topology()
    p = tmp_path / "banded.json"
    p.write_text(
        json.dumps(
            _banded(
                topo,
                [
                    {"after": 2, "seconds": [5e-4, 512e-3]},  # half the base cost
                    {"after": 4, "seconds": [2.5e-4, 256e-3]},
                ],
            )
        )
    )  # a quarter
    cm = CostModel(load_profile(str(p)))
    assert cm.cpu_call_costs([3, 1]) == pytest.approx([3e-3, 1e-3])  # within the first band: the base curve
    # ranked by tokens: 6, 5 at the base curve; 4, 3 at half; 2, 1 at a quarter; in the order given
    assert cm.cpu_call_costs([1, 6, 3, 5, 2, 4]) == pytest.approx([0.25e-3, 6e-3, 1.5e-3, 5e-3, 0.5e-3, 2e-3])
    assert cm.cpu_call_costs([]) == []
    plain = CostModel(flat_profile(topo, cpu_per_token_s=1e-3))  # no bands: every expert at the base curve
    assert plain.cpu_call_costs([1, 6, 3, 5, 2, 4]) == pytest.approx([1e-3, 6e-3, 3e-3, 5e-3, 2e-3, 4e-3])


def test_the_simulator_charges_a_large_cpu_call_by_its_bands(tmp_path):
    """The simulated CPU path of a layer is its call's banded cost: the same decisions, a shorter TPOT where the
    profile's bands say the later experts of a call cost less."""
    from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
    from dllm_offload_sim.sim.run import simulate
    from tests.simkit import request_from_routing, write_requests

    topo = tiny_topology(n_moe=1, n_experts=32)
    p = tmp_path / "banded.json"
    p.write_text(json.dumps(_banded(topo, [{"after": 2, "seconds": [0.0, 0.0]}])))  # later experts free
    banded, plain = CostModel(load_profile(str(p))), CostModel(flat_profile(topo, cpu_per_token_s=1e-3))
    # two tokens per forward, four distinct experts: every decode layer's CPU call has four experts of one token
    fwd = [[[0, 1]], [[2, 3]]]
    path = write_requests(tmp_path / "t", topo, [request_from_routing(0, [fwd, fwd, fwd])])
    got = {
        name: simulate(path, KTransformersPolicy(), 0, cost).summary
        for name, cost in (("banded", banded), ("plain", plain))
    }
    assert got["banded"]["cpu_experts"] == got["plain"]["cpu_experts"] > 0  # the same decisions
    # each decode forward's CPU call: 4 ms at the base curve, 2 ms with the later two free
    assert got["plain"]["tpot_ms"] - got["banded"]["tpot_ms"] == pytest.approx(2.0, rel=1e-6)


BAD_OPTIONAL_FIELDS = (
    [("cpu_expert", "call_overhead_s", bad) for bad in (-1e-3, float("nan"), "x")]
    + [("stamp", "host_launch_us", bad) for bad in (0, -1.5, float("nan"), "10", True)]
    + [("cpu_expert", "threads", bad) for bad in (0, -2, 2.5, "8", True)]
    + [
        ("cpu_expert", "mem_gbps", bad)
        for bad in ([], [0.0], [90.0, -1.0], [float("nan")], 80.0, ["80"], [True])
    ]
    + [("runtime", "routing_sync_s", bad) for bad in (-1e-6, float("inf"), "1", True)]
    + [("runtime", "warp_drive_s", 1e-6)]
)  # an unknown runtime field


@pytest.mark.parametrize(
    "bands, field",
    [
        ([], "cpu_expert.bands"),
        ([{"after": 0, "seconds": [1e-3, 1e-3]}], r"cpu_expert.bands\[0\].after"),
        (
            [{"after": 8, "seconds": [1e-3, 1e-3]}, {"after": 8, "seconds": [1e-3, 1e-3]}],
            r"cpu_expert.bands\[1\].after",
        ),
        ([{"after": 8, "seconds": [1e-3]}], r"cpu_expert.bands\[0\].seconds"),
        ([{"after": 8, "seconds": [1e-3, -1.0]}], r"cpu_expert.bands\[0\].seconds"),
        ([{"after": 8}], r"cpu_expert.bands\[0\]"),
    ],
)
def test_bad_cpu_bands_name_the_band_and_field(tmp_path, bands, field):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(_banded(tiny_topology(), bands)))
    with pytest.raises(ProfileError, match=field):
        load_profile(str(p))


@pytest.mark.parametrize("section, field, bad", BAD_OPTIONAL_FIELDS)
def test_bad_optional_profile_field_names_the_field(tmp_path, section, field, bad):
    d = flat_profile(tiny_topology()).to_dict()
    d.setdefault(section, {})[field] = bad
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=f"{section}.{field}"):
        load_profile(str(p))


def test_cpu_threads_are_read_for_the_replay(tmp_path):
    d = flat_profile(tiny_topology()).to_dict()
    p = tmp_path / "p.json"
    d["cpu_expert"]["threads"] = 3
    p.write_text(json.dumps(d))
    assert CostModel(str(p)).cpu_expert_threads == 3
    del d["cpu_expert"]["threads"]
    p.write_text(json.dumps(d))
    assert CostModel(str(p)).cpu_expert_threads is None


def test_kernel_curve_of_the_wrong_shape_is_refused(tmp_path):
    d = flat_profile(tiny_topology(), gpu_device_s=1e-4).to_dict()
    d["gpu_experts_device"]["seconds"] = [[1e-4]]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="gpu_experts_device.seconds"):
        load_profile(str(p))


def _without_and_with_runtime(tmp_path, topo, runtime: dict):
    """Two profile files of ``topo``: without a ``runtime`` section, and with ``runtime``."""
    d = flat_profile(topo).to_dict()
    p0, p1 = tmp_path / "p0.json", tmp_path / "p1.json"
    p0.write_text(json.dumps(d))
    p1.write_text(json.dumps({**d, "runtime": runtime}))
    return p0, p1


def test_runtime_overheads_are_charged_once_per_moe_layer(tmp_path):
    """The profile's per-layer runtime overheads (routing wait, bookkeeping, the layer's residual) add to every MoE
    layer of a simulated forward, and to nothing else."""
    from tests.simkit import random_request, write_requests
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    import numpy as np

    topo = tiny_topology(n_moe=3, n_experts=8)
    p0, p1 = _without_and_with_runtime(
        tmp_path, topo, {"routing_sync_s": 2e-5, "bookkeeping_s": 1e-4, "layer_residual_s": 3e-5}
    )
    assert (
        CostModel(str(p1)).layer_overhead_s == pytest.approx(1.5e-4)
        and CostModel(str(p0)).layer_overhead_s == 0
    )
    trace = Trace.open(
        write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 5, 2)])
    )
    a, b = (simulate(trace, FullResidencyPolicy(), 4, CostModel(str(p))).per_forward for p in (p0, p1))
    assert np.allclose(b.duration_s - a.duration_s, 3 * 1.5e-4)


def test_cpu_call_in_replay_is_charged_once_per_cpu_call(tmp_path):
    """``runtime.cpu_call_s`` adds to the fixed cost of a layer's CPU call (its dispatch), not to the
    per-layer overhead: a layer without CPU experts does not pay it."""
    topo = tiny_topology(n_moe=3, n_experts=8)
    p0, p1 = _without_and_with_runtime(tmp_path, topo, {"routing_sync_s": 2e-5, "cpu_call_s": 3e-4})
    a, b = CostModel(str(p0)), CostModel(str(p1))
    assert b.cpu_dispatch_seconds(4) - a.cpu_dispatch_seconds(4) == pytest.approx(3e-4)
    assert b.layer_overhead_s == pytest.approx(2e-5) and b.cpu_call_in_replay_s == pytest.approx(3e-4)


def _first_miss_copied_without_and_with(tmp_path, runtime: dict):
    """(per-forward table, cost model) of one random request simulated under a policy that copies each layer's first
    miss and runs the others on the CPU, with a profile without a ``runtime`` section, then with ``runtime``."""
    from tests.simkit import random_request, write_requests
    from dllm_offload_sim.policies.base import LayerDecision, Policy
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    import numpy as np

    class FirstMissCopied(Policy):
        """Copies each layer's first miss, runs the others on the CPU, keeps what fits."""

        def decide(self, view):
            m = view.missed.tolist()
            keep = set(sorted(view.resident | set(m[:1]))[: view.capacity])
            return LayerDecision(to_gpu=m[:1], to_cpu=m[1:], retain=keep)

    topo = tiny_topology(n_moe=3, n_experts=8)
    p0, p1 = _without_and_with_runtime(tmp_path, topo, runtime)
    trace = Trace.open(
        write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 5, 3)])
    )
    c0, c1 = CostModel(str(p0)), CostModel(str(p1))
    a, b = (simulate(trace, FirstMissCopied(), 2, c) for c in (c0, c1))
    return (a.per_forward, c0), (b.per_forward, c1)


def test_a_cpu_call_and_copies_beside_it_slow_each_other_while_both_run():
    """``costmodel.contention.overlapped_ends``: hand-counted ends of a CPU call and copies that share host memory."""
    from dllm_offload_sim.costmodel.contention import OverlapEnds, overlapped_ends

    # CPU alone 0-4, copies alone 1-3; beside each other from 1 the CPU runs 1.5x and the copies 1.25x slower:
    # the copies' 2 s take 2.5 (end 3.5), while the CPU does 2.5 / 1.5 of its 3 s left, the rest alone: 4.8333
    ends = overlapped_ends(0.0, 4.0, 1.0, 3.0, 0.5, 0.25)
    assert ends.copies_end_s == pytest.approx(3.5) and ends.cpu_end_s == pytest.approx(3.5 + 3 - 2.5 / 1.5)
    assert ends.copies_delay_s == pytest.approx(0.5) and ends.cpu_delay_s == pytest.approx(
        ends.cpu_end_s - 4.0
    )
    # the CPU call ends first: from 1 its 1 s left takes 1.5, the copies do 1.5 / 1.25 of their 3 s, then 1.8 alone
    ends = overlapped_ends(0.0, 2.0, 1.0, 4.0, 0.5, 0.25)
    assert ends.cpu_end_s == pytest.approx(2.5) and ends.copies_end_s == pytest.approx(2.5 + 3 - 1.5 / 1.25)
    assert overlapped_ends(0.0, 1.0, 1.0, 2.0, 0.5, 0.5) == OverlapEnds(
        1.0, 2.0
    )  # one after the other: as alone
    assert overlapped_ends(0.0, 3.0, 1.0, 2.0, 0.0, 0.0) == OverlapEnds(3.0, 2.0)  # no slowdown measured
    # one shared slowdown k delays both ends by k times their overlap
    ends = overlapped_ends(0.0, 4.0, 1.0, 3.0, 0.2, 0.2)
    assert ends.copies_end_s == pytest.approx(3.0 + 0.2 * 2) and ends.cpu_end_s == pytest.approx(
        4.0 + 0.2 * 2
    )


def test_a_profile_before_the_slowdowns_reads_its_stall_per_copy_as_one_shared_slowdown(tmp_path):
    """A profile with ``runtime.cpu_stall_per_copy_s`` and no slowdowns: the old probe's copies (24) outlasted its call
    (8 experts x 1 token), so stall x 24 over that call's length alone is the slowdown of both; with the slowdowns the
    stall is not read."""
    from dllm_offload_sim.costmodel.contention import STALL_PROBE_COPIES, STALL_PROBE_EXPERTS

    topo = tiny_topology(n_moe=3, n_experts=16)
    p0, p1 = _without_and_with_runtime(tmp_path, topo, {"cpu_stall_per_copy_s": 5e-5})
    a, b = CostModel(str(p0)), CostModel(str(p1))
    assert a.contention_from_stall and a.cpu_slowdown_beside_copies == a.copies_slowdown_beside_cpu == 0.0
    call = b.cpu_dispatch_seconds(STALL_PROBE_EXPERTS) + sum(b.cpu_call_costs([1] * STALL_PROBE_EXPERTS))
    assert b.contention_from_stall
    assert (
        b.cpu_slowdown_beside_copies
        == b.copies_slowdown_beside_cpu
        == pytest.approx(5e-5 * STALL_PROBE_COPIES / call)
    )
    (tmp_path / "new").mkdir()
    _, p2 = _without_and_with_runtime(
        tmp_path / "new", topo, {"cpu_stall_per_copy_s": 5e-5, "cpu_slowdown_beside_copies": 0.1}
    )
    c = CostModel(str(p2))
    assert (
        not c.contention_from_stall
        and c.cpu_slowdown_beside_copies == 0.1
        and c.copies_slowdown_beside_cpu == 0.0
    )


def test_a_layers_cpu_call_and_copies_share_host_memory_in_the_closed_form_and_the_event_loop(tmp_path):
    """Beside a layer's CPU call its demand copies land later, and the call computes later, each by the overlap rule
    (``CostModel.cpu_and_copies``) applied to when each would end alone; copies in a layer without a CPU call land as
    before, and the closed form and the event loop agree."""
    from tests.simkit import flat_profile, random_request, write_requests
    from dllm_offload_sim.costmodel.contention import overlapped_ends
    from dllm_offload_sim.policies.base import LayerDecision, Policy
    from dllm_offload_sim.sim.run import simulate
    import numpy as np

    class HalfCopied(Policy):
        """Odd layers copy every miss; even layers copy the first and run the rest on the CPU."""

        def decide(self, view):
            m = view.missed.tolist()
            to_gpu, to_cpu = (m, []) if view.layer % 2 else (m[:1], m[1:])
            keep = set(sorted(view.resident | set(to_gpu))[: view.capacity])
            return LayerDecision(to_gpu=to_gpu, to_cpu=to_cpu, retain=keep)

    topo = tiny_topology(n_moe=3, n_experts=8)
    trace = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 5, 3)])
    prof = flat_profile(
        topo, cpu_per_token_s=4e-3
    )  # a CPU call about as long as a layer's copies (10 ms each)
    runs, forwards = [], []
    for rt in (
        {"cpu_slowdown_beside_copies": 0.0},
        {"cpu_slowdown_beside_copies": 0.4, "copies_slowdown_beside_cpu": 0.2},
    ):
        prof.runtime = rt
        for closed_form in (True, False):
            r = simulate(trace, HalfCopied(), 2, CostModel(prof), record_layers=True, closed_form=closed_form)
            runs.append(r.layers)
            forwards.append(r.per_forward)
    assert runs[0].equals(runs[1]) and runs[2].equals(runs[3])  # the closed form and the event loop agree
    assert forwards[2].equals(forwards[3])
    assert (forwards[0].cpu_slowed_s == 0).all() and (forwards[0].copies_slowed_s == 0).all()
    a, b = runs[0], runs[2]
    rel = lambda d, col: (d[col] - d.gate_s).to_numpy()  # noqa: E731
    beside = ((a.to_cpu > 0) & (a.to_gpu > 0)).to_numpy()
    alone = ((a.to_cpu == 0) & (a.to_gpu > 0)).to_numpy()
    assert beside.any() and alone.any()
    h2d = CostModel(prof).expert_h2d_seconds()
    overlapping, cpu_slowed, copies_slowed = 0, 0.0, 0.0
    for i in np.flatnonzero(beside):  # each from when its paths would end alone (run a), relative to the gate
        cpu_alone, landed_alone = rel(a, "cpu_computed_s")[i], rel(a, "copies_end_s")[i]
        want = overlapped_ends(0.0, cpu_alone, landed_alone - a.to_gpu.iloc[i] * h2d, landed_alone, 0.4, 0.2)
        assert rel(b, "copies_end_s")[i] == pytest.approx(want.copies_end_s)
        assert rel(b, "cpu_computed_s")[i] == pytest.approx(want.cpu_end_s)
        overlapping += want.copies_end_s > landed_alone
        cpu_slowed, copies_slowed = cpu_slowed + want.cpu_delay_s, copies_slowed + want.copies_delay_s
    assert overlapping > 0
    # the per-forward table sums what the shared memory cost each path (every forward, measured or not)
    assert forwards[2].cpu_slowed_s.sum() == pytest.approx(cpu_slowed)
    assert forwards[2].copies_slowed_s.sum() == pytest.approx(copies_slowed)
    assert np.allclose(rel(b, "copies_end_s")[alone], rel(a, "copies_end_s")[alone])


def test_a_cpu_call_the_gpu_works_beside_pays_the_busy_gpu_term_in_proportion(tmp_path):
    """``runtime.cpu_busy_gpu_s``: a layer's CPU path is longer by that much times the share of the CPU call's compute
    its GPU path covers (at most once); layers without CPU experts, and the counters, are unchanged."""
    import numpy as np

    (fa, _), (fb, c1) = _first_miss_copied_without_and_with(tmp_path, {"cpu_busy_gpu_s": 5e-4})
    assert c1.cpu_busy_gpu_s == pytest.approx(5e-4) and c1.describe()["cpu_busy_gpu_us"] == pytest.approx(500)
    assert (fa[["hits", "to_gpu", "to_cpu"]].values == fb[["hits", "to_gpu", "to_cpu"]].values).all()
    cpu = fa.to_cpu > 0
    extra = fb.cpu_path_s - fa.cpu_path_s
    assert (extra[cpu] > 0).all() and (extra[cpu] <= 3 * 5e-4 + 1e-12).all()  # at most once per MoE layer
    assert np.allclose(extra[~cpu], 0) and np.allclose(fb.duration_s[~cpu], fa.duration_s[~cpu])


def test_the_busy_gpu_term_follows_the_share_of_the_call_the_gpu_path_covers():
    """The charge is ``cpu_busy_gpu_s`` times min(1, GPU path / CPU compute), added to the CPU path's end and to the
    forward's CPU-path time; nothing without the term, a CPU call or GPU work."""
    from dllm_offload_sim.schedule.timeline import ExpertCalls, layer_span

    def span(gpu_s, busy=2e-4, t_gate=1.0, cpu_alone=2.0):  # the GPU path issued at 1.5
        return layer_span(ExpertCalls(hit=(gpu_s, gpu_s)), t_gate, 1.5, 0.0, cpu_alone, cpu_busy_gpu_s=busy)

    half = span(0.5)  # the GPU path covers half of the call's compute [1, 2]
    assert half.cpu_end_s == pytest.approx(2.0 + 1e-4) and half.cpu_beside_gpu_s == pytest.approx(1e-4)
    assert half.end_s == half.cpu_end_s and half.cpu_compute_s == 1.0
    assert span(3.0).cpu_end_s == pytest.approx(2.0 + 2e-4)  # the GPU outlasts the call: once
    assert span(3.0).end_s == 4.5  # ... and the layer ends with the GPU path
    assert span(0.0).cpu_end_s == 2.0 and span(1.0, t_gate=2.0).cpu_end_s == 2.0  # no GPU work; no compute
    assert span(1.0, busy=0.0).cpu_end_s == 2.0 and span(1.0, busy=0.0).cpu_beside_gpu_s == 0.0


def test_a_layer_span_without_cpu_experts_ends_with_its_gpu_path():
    from dllm_offload_sim.schedule.timeline import ExpertCalls, layer_span

    s = layer_span(ExpertCalls(hit=(3.0, 2.0)), 1.0, 1.0, float("nan"))
    assert (s.gpu_end_s, s.cpu_end_s, s.end_s, s.cpu_compute_s) == (4.0, 1.0, 4.0, 0.0)


def test_a_cpu_result_queues_behind_the_demand_copies_beside_it():
    """Beside its demand copies the CPU call computes later (the overlap's ends) and its result's copy follows the
    copies: the CPU path ends at max(computed, copies landed + result copy), and the layer's slowdowns are kept."""
    from dllm_offload_sim.costmodel.contention import overlapped_ends
    from dllm_offload_sim.schedule.timeline import ExpertCalls, layer_span

    calls = ExpertCalls.plan((1.0, 0.5), (1.0, 0.5), (1.5, 1.0), copies_s=2.0)
    ov = overlapped_ends(0.0, 2.0, 0.0, 2.0, 0.5, 0.5)
    s = layer_span(calls, 0.0, 0.0, ov.copies_end_s, 2.0, ov, result_s=0.25)
    assert s.cpu_computed_s == ov.cpu_end_s and s.cpu_end_s == max(ov.cpu_end_s, ov.copies_end_s + 0.25)
    assert s.cpu_after_copies_s == s.cpu_end_s - 2.0 and s.cpu_slowed_s == ov.cpu_delay_s > 0
    assert s.copies_slowed_s == ov.copies_delay_s and s.end_s == max(s.gpu_end_s, s.cpu_end_s)


def test_a_grouped_call_is_issued_at_the_replays_host_time_where_that_exceeds_the_curves():
    """``runtime.grouped_issue_s``: a grouped call issued with the GPU idle takes at least that host time before its
    kernels; a curve already slower keeps its own; without the term, the curve."""
    prof = flat_profile(tiny_topology(), gpu_s=1e-3, gpu_device_s=0.4e-3)
    assert CostModel(prof).grouped_call_seconds(4, 16) == pytest.approx((1e-3, 0.4e-3))
    prof.runtime = {"grouped_issue_s": 0.9e-3}
    c = CostModel(prof)
    assert c.grouped_call_seconds(4, 16) == pytest.approx((1.3e-3, 0.4e-3))
    assert c.grouped_call_seconds(0, 0) == (0.0, 0.0) and c.describe()["grouped_issue_us"] == pytest.approx(
        900
    )
    prof.runtime = {"grouped_issue_s": 0.2e-3}
    assert CostModel(prof).grouped_call_seconds(4, 16) == pytest.approx((1e-3, 0.4e-3))


def test_submitting_a_cpu_call_delays_the_layers_gpu_path(tmp_path):
    """``runtime.cpu_issue_s``: the runtime's thread submits a layer's CPU call before it issues the layer's copies and
    grouped calls, so in a layer with CPU experts those start that much later (and the CPU result, which queues behind
    the layer's copies, may land later); layers without CPU experts and the counters are unchanged."""
    import numpy as np

    (fa, c0), (fb, c1) = _first_miss_copied_without_and_with(
        tmp_path, {"cpu_issue_s": 5e-3}
    )  # > any flat-profile path
    assert c1.cpu_issue_s == pytest.approx(5e-3) and c0.cpu_issue_s == 0
    assert (fa[["hits", "to_gpu", "to_cpu"]].values == fb[["hits", "to_gpu", "to_cpu"]].values).all()
    assert (fb.cpu_path_s >= fa.cpu_path_s - 1e-12).all()
    longer = fb.duration_s - fa.duration_s
    cpu = fa.to_cpu > 0
    assert cpu.any() and (longer[cpu] > 0).all() and np.allclose(longer[~cpu], 0)
    assert (longer[cpu] <= 3 * 5e-3 + 1e-12).all()  # at most once per MoE layer


def test_an_expert_costs_one_latency_per_copy_the_profiled_runtime_makes(tmp_path):
    import json

    from tests.simkit import flat_profile, tiny_topology

    prof = flat_profile(tiny_topology(), h2d_latency_s=10e-6)
    path = prof.save(tmp_path / "p.json")
    two = CostModel(str(path))  # a profile that does not say: the runtime that copied w13 and w2 separately
    d = json.loads(path.read_text())
    d["h2d"]["copies_per_expert"] = 1  # today's runtime: one contiguous run per expert
    path.write_text(json.dumps(d))
    one = CostModel(str(path))
    assert two.copies_per_expert == 2 and one.copies_per_expert == 1
    assert two.expert_h2d_seconds() - one.expert_h2d_seconds() == pytest.approx(one.h2d_latency_s)
    d["h2d"]["copies_per_expert"] = 0
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"h2d\.copies_per_expert.*must be an integer >= 1.*got 0"):
        CostModel(str(path))


def test_a_cpu_result_lands_after_the_layers_demand_copies(tmp_path):
    """The CPU result goes back over the copy engine behind the layer's demand copies: with copies of 10 ms and a
    CPU path of microseconds, a layer that both copies and runs CPU experts has a CPU path of at least the copy
    plus the result's transfer; one that runs CPU experts without copies keeps its microseconds."""
    from tests.simkit import flat_cost, random_request, write_requests
    from dllm_offload_sim.policies.base import LayerDecision, Policy
    from dllm_offload_sim.sim.run import simulate
    from dllm_offload_sim.traces.reader import Trace
    import numpy as np

    class CopyOnlyInEvenForwards(Policy):
        """Runs every miss on the CPU, and copies the first one in even forwards."""

        def decide(self, view):
            m = view.missed.tolist()
            copy = m[:1] if view.forward.index % 2 == 0 else []
            return LayerDecision(
                to_gpu=copy,
                to_cpu=[e for e in m if e not in copy],
                retain=set(sorted(view.resident | set(copy))[: view.capacity]),
            )

    topo = tiny_topology(n_moe=3, n_experts=8)
    cm = flat_cost(topo, h2d_s=10e-3, cpu_per_token_s=1e-6)
    trace = Trace.open(
        write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 3)])
    )
    f = simulate(trace, CopyOnlyInEvenForwards(), 2, cm).per_forward
    both = (f.to_cpu > 0) & (f.to_gpu > 0)
    cpu_only = (f.to_cpu > 0) & (f.to_gpu == 0)
    assert both.any() and cpu_only.any()
    assert (f.cpu_path_s[both] >= cm.expert_h2d_seconds() + cm.cpu_result_seconds(1)).all()
    assert (f.cpu_path_s[cpu_only] < 1e-3).all()


def test_the_contention_probe_reads_a_slowdown_as_beside_over_alone_less_one():
    from dllm_offload_sim.profiler.runtime_overhead import slowdown

    assert slowdown(2e-3, 2.5e-3) == pytest.approx(0.25)
    assert slowdown(2e-3, 1.9e-3) == 0.0  # faster beside than alone (noise): nothing to charge
    assert slowdown(0.0, 1e-3) == 0.0


def test_every_runtime_term_has_a_row_in_the_docs():
    """docs/cost-model.md's table of the runtime's terms lists each record of RUNTIME_TERMS with its unit and what it
    is charged per, so a new term shows up in the reference."""
    from pathlib import Path

    from dllm_offload_sim.costmodel.runtime_terms import RUNTIME_TERMS

    doc = (Path(__file__).resolve().parent.parent / "docs" / "cost-model.md").read_text()
    missing = [t.name for t in RUNTIME_TERMS if f"| `{t.name}` | {t.unit} | {t.per} |" not in doc]
    assert missing == []


def test_a_runtime_term_without_a_value_takes_its_default_or_the_term_it_names():
    from dllm_offload_sim.costmodel.runtime_terms import runtime_value

    assert runtime_value(None, "policy_time_factor") == 1.0
    assert runtime_value({"grouped_issue_s": 4e-5}, "grouped_issue_cpu_s") == 4e-5
    assert (
        runtime_value({"grouped_issue_s": 4e-5, "grouped_issue_cpu_s": 6e-5}, "grouped_issue_cpu_s") == 6e-5
    )
    assert runtime_value({}, "bookkeeping_cpu_s") == 0.0
