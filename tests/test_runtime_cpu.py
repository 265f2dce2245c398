"""Runtime primitives on the CPU: slot bookkeeping, grouped == per-expert compute, CPU experts, copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.profiler.measure import default_profile_name, measure_profile
from tests.simkit import tiny_topology
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_experts import CpuExperts, cpu_expert_ffn
from dllm_offload_sim.runtime.grouped import grouped_ffn, routing_plan
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.layer import LmHead, NonExpertLayer
from dllm_offload_sim.runtime.grouped import MAX_GROUPS, plan_from_numpy
from dllm_offload_sim.runtime.slot_pool import SlotPool, SlotPoolFull, layer_homes


def test_an_expert_is_one_contiguous_run_copied_in_one_operation():
    topo = tiny_topology(n_moe=2, n_experts=8)
    host = HostExperts(topo, n_real_layers=2, dtype=torch.float32, pin=False, seed=3)
    w13, w2 = host.expert(1, 5)
    assert w13.data_ptr() == host.expert_flat(1, 5).data_ptr() and host.expert_flat(1, 5).is_contiguous()
    assert host.expert_bytes == (w13.numel() + w2.numel()) * 4 == host.expert_flat(1, 5).numel() * 4
    pool = SlotPool(4, topo.hidden, topo.moe_intermediate, dtype=torch.float32)
    cp = ExpertCopier(host, pool, "cpu")
    cp.demand(1, [5], [pool.assign(1, 5)])
    s = pool.lookup(1, 5)
    assert cp.copied == 1 and torch.equal(pool.w13[s], w13) and torch.equal(pool.w2[s], w2)


def test_the_copiers_addresses_are_the_views_places():
    """The batched copy path addresses each copy as ``ExpertCopier.demand``'s views do: slot ``s``'s run and expert
    ``e``'s run of the layer's real layer."""
    topo = tiny_topology(n_moe=3, n_experts=8)
    host = HostExperts(topo, n_real_layers=2, dtype=torch.float32, pin=False, seed=3)
    pool = SlotPool(5, topo.hidden, topo.moe_intermediate, dtype=torch.float32)
    cp = ExpertCopier(host, pool, "cpu")
    assert cp.batch is None  # no CUDA runtime: torch copies
    for layer in (0, 1, 2):
        dst, src = cp.addresses(layer, [7, 0, 3], [4, 1, 0])
        assert dst.tolist() == [pool.slot_flat[s].data_ptr() for s in (4, 1, 0)]
        assert src.tolist() == [host.expert_flat(layer, e).data_ptr() for e in (7, 0, 3)]


def test_a_copier_whose_batched_copy_fails_warns_and_copies_through_torch():
    topo = tiny_topology(n_moe=2, n_experts=8)
    host = HostExperts(topo, n_real_layers=2, dtype=torch.float32, pin=False, seed=3)
    pool = SlotPool(4, topo.hidden, topo.moe_intermediate, dtype=torch.float32)
    cp = ExpertCopier(host, pool, "cpu")

    class Failing:
        def copy(self, dst, src, nbytes, stream):
            raise RuntimeError("cudaMemcpyBatchAsync failed with CUDA error 1")

    cp.batch = Failing()
    with pytest.warns(RuntimeWarning, match="CUDA error 1: expert copies go through torch from now on"):
        cp.demand(1, [5, 2], [0, 3])
    assert cp.batch is None and cp.copied == 2
    assert torch.equal(pool.slot_flat[0], host.expert_flat(1, 5)) and torch.equal(
        pool.slot_flat[3], host.expert_flat(1, 2)
    )


class _FakeCudart:
    """A CUDA runtime's two copy entry points, recording their calls."""

    def __init__(self, batched: bool):
        self.calls = []
        if batched:
            self.cudaMemcpyBatchAsync = lambda *a: self.calls.append(("batch", a)) or 0
        self.cudaMemcpyAsync = type("F", (), {"__call__": lambda _, *a: self.calls.append(("one", a)) or 0})()


def test_a_batch_of_copies_is_one_runtime_call_or_one_per_copy_when_few_or_without_the_batch_call():
    import ctypes

    from dllm_offload_sim.runtime.cuda_copies import BatchCopier

    dst, src = np.array([100, 200, 300], np.uint64), np.array([7, 8, 9], np.uint64)
    lib = _FakeCudart(batched=True)
    b = BatchCopier(lib, 13000, single_up_to=2)
    b.lead_single = False
    b.copy(dst, src, 64, stream=5)
    ((kind, args),) = lib.calls
    assert (
        kind == "batch" and len(args) == 8 and args[3].value == 3 and args[-1].value == 5
    )  # 13.x: no failIdx
    sizes = ctypes.cast(args[2], ctypes.POINTER(ctypes.c_uint64))
    assert [sizes[i] for i in range(3)] == [64, 64, 64]
    lib = _FakeCudart(batched=True)  # by default a batch's first copy goes alone, ahead of the batch call
    BatchCopier(lib, 13000, single_up_to=2).copy(dst, src, 64, stream=5)
    (one, first), (kind, args) = lib.calls
    assert one == "one" and first == (100, 7, 64, 1, 5) and kind == "batch" and args[3].value == 2
    d = ctypes.cast(args[0], ctypes.POINTER(ctypes.c_uint64))
    assert [d[i] for i in range(2)] == [200, 300]
    lib = _FakeCudart(batched=True)
    BatchCopier(lib, 12080, single_up_to=2).copy(dst, src, 64, stream=5)
    assert len(lib.calls[1][1]) == 9  # 12.8 / 12.9: a failIdx before the stream
    lib = _FakeCudart(
        batched=True
    )  # a call of few copies: one cudaMemcpyAsync each, the batch call has a fixed cost
    BatchCopier(lib, 13000, single_up_to=3).copy(dst, src, 64, stream=5)
    assert [a for _, a in lib.calls] == [(100, 7, 64, 1, 5), (200, 8, 64, 1, 5), (300, 9, 64, 1, 5)]
    lib = _FakeCudart(batched=False)
    BatchCopier(lib, 12040).copy(dst, src, 64, stream=5)
    assert [a for _, a in lib.calls] == [(100, 7, 64, 1, 5), (200, 8, 64, 1, 5), (300, 9, 64, 1, 5)]
    failing = _FakeCudart(batched=True)
    failing.cudaMemcpyBatchAsync = lambda *a: 1
    with pytest.raises(RuntimeError, match="cudaMemcpyBatchAsync failed with CUDA error 1"):
        BatchCopier(failing, 13000, single_up_to=0).copy(dst, src, 64, stream=5)
    lib = _FakeCudart(
        batched=True
    )  # a single copy either way (the native CPU engine's): the runtime infers it
    BatchCopier(lib, 13000).copy_one(100, 7, 64, stream=5)
    assert lib.calls == [("one", (100, 7, 64, 4, 5))]  # cudaMemcpyDefault
    failing = _FakeCudart(batched=False)
    failing.cudaMemcpyAsync = type("F", (), {"__call__": lambda _, *a: 2})()
    with pytest.raises(RuntimeError, match="cudaMemcpyAsync failed with CUDA error 2"):
        BatchCopier(failing, 13000).copy_one(100, 7, 64, stream=5)


def test_the_cuda_runtime_is_found_where_the_process_mapped_it(tmp_path):
    from dllm_offload_sim.runtime.cuda_copies import loaded_cudart

    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 0 08:01 2 /venv/nvidia/cu13/lib/libcudart.so.13\n\n"
    )
    assert loaded_cudart(str(maps)) == "/venv/nvidia/cu13/lib/libcudart.so.13"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    assert loaded_cudart(str(maps)) is None and loaded_cudart(str(tmp_path / "absent")) is None


def test_slot_pool_bookkeeping():
    p = SlotPool(3, 8, 4, dtype=torch.float32)
    assert p.assign(1, 5) == 0 and p.assign(1, 7) == 1 and p.assign(1, 5) == 0
    assert p.assign(2, 5) == 2 and p.free_slots == 0
    with pytest.raises(SlotPoolFull):
        p.assign(2, 6)
    assert p.evict(1, 7) == 1 and p.assign(2, 6) == 1
    assert p.resident(1) == {5} and p.resident(2) == {5, 6}
    gone, new = p.set_layer(2, [6, 9])
    assert gone == [5] and new == [9] and p.resident(2) == {6, 9}
    lut = p.slot_lut(2, 10)
    assert lut[6] == p.lookup(2, 6) and lut[9] == p.lookup(2, 9) and lut[5] == -1
    with pytest.raises(KeyError):
        p.evict(3, 1)
    p.check()


def test_slot_pool_keeps_each_layer_in_its_home_range():
    """With home ranges, a layer's residents stay contiguous under churn, so one grouped window
    covers them (scattered slots would split a layer over several grouped calls)."""
    import numpy as np

    L, C, E = 19, 100, 256
    p = SlotPool(L * C + E, 4, 2, dtype=torch.float32, home=layer_homes(L, C))
    rng = np.random.default_rng(0)
    for _ in range(30):
        for j in range(L):
            p.set_layer(j, rng.choice(E, size=C, replace=False))
            slots = [p.lookup(j, e) for e in p.resident(j)]
            assert min(slots) >= j * C and max(slots) < (j + 1) * C
    lut = p.slot_lut(7, E).numpy()
    ids = rng.choice(np.flatnonzero(lut >= 0), size=(16, 8))
    plan = plan_from_numpy(ids, np.ones((16, 8), np.float32), lut, p.n_slots, "cpu")
    assert len(plan.windows) == 1 and plan.windows[0][1] - plan.windows[0][0] <= MAX_GROUPS
    # over capacity (a layer-adaptive policy): the extra experts go to the lowest free slot elsewhere
    p.set_layer(3, [])
    p.set_layer(2, range(C + 5))
    assert sorted(p.lookup(2, e) for e in range(C + 5))[-5:] == list(range(3 * C, 3 * C + 5))
    p.check()
    with pytest.raises(ValueError, match="home range of layer 1"):
        SlotPool(10, 4, 2, home=[(0, 5), (5, 11)])


class _ReferencePool:
    """The slot pool's placement rule, one expert at a time over a sorted free list: a layer's expert takes the lowest
    free slot of its home range, else of the rest of its window block, else anywhere."""

    def __init__(self, n, home, window):
        self.free, self.home, self.window, self.slot = list(range(n)), home, window, {}

    def assign(self, layer, e):
        if (layer, e) in self.slot:
            return self.slot[(layer, e)]
        order = []
        if self.home is not None and layer < len(self.home):
            a, b = self.home[layer]
            order.append(lambda s: a <= s < b)
            if self.window:
                lo = a // self.window * self.window
                order.append(lambda s: lo <= s < lo + self.window)
        order.append(lambda s: True)
        s = next(s for inside in order for s in self.free if inside(s))
        self.free.remove(s)
        self.slot[(layer, e)] = s
        return s

    def evict(self, layer, e):
        s = self.slot.pop((layer, e))
        self.free = sorted(self.free + [s])
        return s

    def resident(self, layer):
        return {e for (j, e) in self.slot if j == layer}


@pytest.mark.parametrize("window", [None, 16])
def test_the_slot_pool_places_experts_by_its_rule_under_churn(window):
    """``assign_many`` (a layer's demand copies in one compiled call), ``assign``, ``release`` and ``set_layer`` give
    the slots the placement rule gives one expert at a time (``_ReferencePool``), through home ranges, window blocks,
    a layer without a home, repeated and resident experts, under random churn; the slot tables stay live."""
    import numpy as np

    from dllm_offload_sim.runtime.slot_pool import block_layout

    L, C, E = 5, 6, 24
    homes, n = block_layout(L, C, 4, window, 3) if window else (layer_homes(L, C), L * C + 8)
    ref, pool = (
        _ReferencePool(n, homes, window),
        SlotPool(n, 4, 2, dtype=torch.float32, home=homes, window=window, n_experts=E),
    )
    luts = [pool.layer_lut(j, E) for j in range(L + 1)]  # read once: kept up to date by the pool
    rng = np.random.default_rng(1)
    for _ in range(600):
        j, r = int(rng.integers(L + 1)), rng.random()  # layer L has no home range
        if r < 0.4 and ref.free:
            experts = [
                int(e) for e in rng.integers(0, E, size=int(rng.integers(1, min(12, len(ref.free)) + 1)))
            ]
            assert pool.assign_many(j, experts) == [ref.assign(j, e) for e in experts]
        elif r < 0.5 and ref.resident(j):
            e = int(rng.choice(sorted(ref.resident(j))))
            assert pool.evict(j, e) == ref.evict(j, e)
        else:
            want = set(int(e) for e in rng.choice(E, size=int(rng.integers(0, C + 3)), replace=False))
            have = ref.resident(j)
            if len(want - have) > len(ref.free) + len(have - want):
                continue
            gone, new = sorted(have - want), sorted(want - have)
            for e in gone:
                ref.evict(j, e)
            assert pool.set_layer(j, want) == (gone, new) and [pool.lookup(j, e) for e in new] == [
                ref.assign(j, e) for e in new
            ]
        for layer in range(L + 1):
            expect = np.full(E, -1)
            for e in ref.resident(layer):
                expect[e] = ref.slot[(layer, e)]
            assert (luts[layer] == expect).all() and pool.resident(layer) == ref.resident(layer)
        assert pool.free_slots == len(ref.free) and len(pool) == n - len(ref.free)
        pool.check()
    assert pool.assign_many(0, []) == []
    with pytest.raises(SlotPoolFull):
        pool.assign_many(1, [E + i for i in range(pool.free_slots + 1)])


def _reference(x, ids, w, host: HostExperts, layer: int):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            w13, w2 = host.expert(layer, int(ids[t, j]))
            out[t] += w[t, j] * cpu_expert_ffn(x[t : t + 1], w13, w2)[0]
    return out


@pytest.mark.parametrize("backend", ["bmm", "loop"])
def test_grouped_equals_per_token_reference(backend):
    topo = tiny_topology(n_experts=8, top_k=2)
    host = HostExperts(topo, dtype=torch.float32, pin=False)
    pool = SlotPool(8, topo.hidden, topo.moe_intermediate, dtype=torch.float32)
    for e in range(8):
        s = pool.assign(1, e)
        pool.w13[s], pool.w2[s] = host.expert(1, e)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, topo.hidden, generator=g)
    ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(6)])
    w = torch.rand(6, 2, generator=g)
    lut = pool.slot_lut(1, 8)
    got = grouped_ffn(x, pool.w13, pool.w2, routing_plan(ids, w, lut, 8), backend=backend)
    torch.testing.assert_close(got, _reference(x, ids, w, host, 1), rtol=1e-5, atol=1e-5)


def test_routing_plan_skips_experts_without_slot():
    ids = torch.tensor([[0, 1], [1, 2]])
    lut = torch.tensor([-1, 3, 0])
    plan = routing_plan(ids, torch.ones(2, 2), lut, 4)
    assert plan.slot.tolist() == [0, 3, 3] and plan.token.tolist() == [1, 0, 1]
    assert plan.slots.tolist() == [0, 3] and plan.counts.tolist() == [1, 2]


def test_cpu_experts_match_reference_and_workers_agree():
    topo = tiny_topology()
    host = HostExperts(topo, dtype=torch.float32, pin=False)
    x = torch.randn(5, topo.hidden)
    jobs = [
        (*host.expert(1, e), torch.tensor(rows), torch.rand(len(rows)))
        for e, rows in ((0, [0, 2]), (3, [1, 4]), (5, [2]))
    ]
    one = CpuExperts(1).run(x, jobs)
    two = CpuExperts(2)
    torch.testing.assert_close(two.run(x, jobs), one)
    two.close()
    ref = torch.zeros_like(x)
    for w13, w2, rows, w in jobs:
        ref.index_add_(0, rows, cpu_expert_ffn(x[rows], w13, w2) * w[:, None])
    torch.testing.assert_close(one, ref)


def test_host_experts_alias_layers():
    topo = tiny_topology(n_moe=4)
    host = HostExperts(topo, n_real_layers=2, dtype=torch.float32, pin=False)
    assert host.expert(3, 1)[0].data_ptr() == host.expert(1, 1)[0].data_ptr()
    assert host.expert(2, 1)[0].data_ptr() != host.expert(1, 1)[0].data_ptr()
    assert host.expert_bytes == 3 * topo.hidden * topo.moe_intermediate * 4


def test_copier_demand_and_prefetch_rules():
    topo = tiny_topology(n_moe=3)
    host = HostExperts(topo, dtype=torch.float32, pin=False)
    pool = SlotPool(4, topo.hidden, topo.moe_intermediate, dtype=torch.float32)
    cp = ExpertCopier(host, pool, "cpu")
    s = [pool.assign(1, 2)]
    cp.demand(1, [2], s)
    torch.testing.assert_close(pool.w13[s[0]], host.expert(1, 2)[0])
    pool.assign(2, 0)
    cp.replace_prefetch([(1, 5), (2, 0), (3, 4), (3, 6)])  # layer 1 passed, (2,0) resident, then (3,4)
    cp.pump(current_layer=1, assign_slot=lambda l, e: pool.assign(l, e))
    assert pool.lookup(3, 4) is not None and pool.lookup(1, 5) is None and cp.copied == 2
    cp.pump(current_layer=1, assign_slot=lambda l, e: None)  # no slot: (3,6) skipped
    assert pool.lookup(3, 6) is None and not cp.prefetch


def test_non_expert_layer_and_head_on_cpu():
    topo = tiny_topology(n_experts=8, top_k=2)
    topo = topo.with_widths(n_group=2, topk_group=1)
    layer = NonExpertLayer(topo, dtype=torch.float32)
    cache = layer.new_cache(32)
    x = torch.randn(4, topo.hidden)
    h, ids, w, mlp = layer(x, cache, 8)
    assert h.shape == x.shape and mlp.shape == x.shape and ids.shape == (4, 2)
    assert (ids // 4).unique(dim=None).numel() <= 2 and torch.allclose(w.sum(-1), torch.full((4,), 2.5))
    assert cache[0][:, 8:12].abs().sum() > 0 and cache[0][:, 12:].abs().sum() == 0
    tok, conf = LmHead(topo, dtype=torch.float32)(h)
    assert tok.shape == (4,) and ((conf > 0) & (conf <= 1)).all()


def test_a_layer_of_a_model_without_shared_experts_has_no_shared_mlp():
    topo = tiny_topology(n_experts=8, top_k=2).with_widths(n_shared_experts=0, n_group=1, topk_group=1)
    layer = NonExpertLayer(topo, dtype=torch.float32)
    h, ids, w, mlp = layer(torch.randn(3, topo.hidden), layer.new_cache(16), 0)
    assert mlp is None and h.shape == (3, topo.hidden) and ids.shape == (3, 2) and layer.w13 is None


def test_an_h2d_curve_that_does_not_grow_with_the_bytes_is_measured_again(tmp_path, monkeypatch):
    """A slow spell over the smallest copies (their median no shorter than the largest's) is measured again, so a
    busy host does not write a profile whose copies imply an impossible bandwidth."""
    import dllm_offload_sim.profiler.measure as measure

    calls = []

    def first_flat(fns, time_once, passes=5):
        out = measure.__dict__["_real_interleaved"](fns, time_once, passes)
        calls.append(len(fns))
        return [max(out)] * len(out) if len(calls) == 1 else out  # the first (the H2D curve) comes out flat

    monkeypatch.setitem(measure.__dict__, "_real_interleaved", measure.interleaved_medians)
    monkeypatch.setattr(measure, "interleaved_medians", first_flat)
    said = []
    prof = measure_profile(
        tiny_topology(n_experts=8), device="cpu", dtype=torch.float32, quick=True, name="cpu-tiny",
        progress=said.append, cpu_threads=1,
    )  # fmt: skip
    assert any(s.startswith("h2d again") for s in said), said
    h = CostModel(str(prof.save(tmp_path / "p.measured.json"))).profile.h2d
    assert h["seconds"][-1] > h["seconds"][0]


@pytest.mark.parametrize("shared", [1, 0], ids=["llada2-like", "olmoe-like"])
def test_profiler_quick_on_cpu_writes_a_valid_profile(tmp_path, shared):
    """Any shape profiles: LLaDA2's (a shared expert, group-limited routing) and OLMoE's (neither)."""
    topo = tiny_topology(n_experts=8)
    if not shared:
        topo = topo.with_widths(n_shared_experts=0, n_group=1, topk_group=1)
    prof = measure_profile(
        topo,
        device="cpu",
        dtype=torch.float32,
        quick=True,
        name="cpu-tiny",
        progress=lambda s: None,
        cpu_threads=1,
    )
    path = prof.save(tmp_path / "cpu-tiny.measured.json")
    cm = CostModel(str(path))
    assert cm.profile.status == "measured" and cm.expert_h2d_seconds() > 0
    assert cm.profile.stamp["torch"] == torch.__version__
    assert "gpu_experts_device" in cm.profile.curves and cm.cpu_call_overhead_s >= 0
    assert cm.gpu_experts_device_seconds(4, 4) <= cm.gpu_experts_seconds(4, 4)
    assert cm.cpu_expert_threads == 1  # what the CPU curve was measured with; the replay uses it
    assert cm.copies_per_expert == 1  # this runtime copies an expert in one operation
    method = cm.profile.method  # how it was timed, as fields (the notes only point to them)
    assert method["cpu_engine"] in ("torch", "kt") and method["cpu_threads"] == 1 and method["repeats"] >= 1
    assert cm.profile.stamp["host_launch_us"] > 0  # the host's launch speed, for validation runs to compare
    probe = cm.profile.stamp["host_probe"]  # reference numbers of the host, before and after the curves
    for when in ("before", "after"):
        assert probe[when]["ref_expert_1tok_us"] > 0 and probe[when]["mem_gbps"] > 0
    assert probe["steal_frac"] is None or 0 <= probe["steal_frac"] <= 1
    rt = cm.profile.runtime
    assert set(rt) == {
        "routing_sync_s",
        "bookkeeping_s",
        "layer_residual_s",
        "forward_residual_s",
        "cpu_call_s",
        "cpu_issue_s",
        "cpu_slowdown_beside_copies",
        "copies_slowdown_beside_cpu",
        "cpu_busy_gpu_s",
        "prefetch_start_s",
        "grouped_issue_s",
        "bookkeeping_cpu_s",
        "grouped_issue_cpu_s",
        "policy_time_factor",
    }
    # the host's steps beside the CPU engine, from the CPU-call probe's replay
    assert rt["bookkeeping_cpu_s"] > 0 and rt["grouped_issue_cpu_s"] > 0
    assert cm.bookkeeping_after_cpu_s == pytest.approx(
        max(rt["bookkeeping_cpu_s"] - rt["bookkeeping_s"], 0.0)
    )
    assert (
        rt["grouped_issue_s"] > 0 and cm.grouped_issue_s == rt["grouped_issue_s"]
    )  # issuing a grouped call, too
    assert rt["cpu_issue_s"] > 0 and cm.cpu_issue_s == rt["cpu_issue_s"]  # submitting a call takes host time
    assert (
        rt["prefetch_start_s"] > 0 and cm.prefetch_start_s == rt["prefetch_start_s"]
    )  # so does starting a prefetch
    assert cm.profile.curves["cpu_expert"]["mem_gbps"][0] > 0 and cm.profile.cpu_curve_gbps() > 0
    assert (
        len(cm.profile.curves["cpu_expert"]["settle_s"]) >= 2
    )  # the engine settled before its curve was timed
    assert cm.policy_time_factor == rt["policy_time_factor"] > 0
    assert rt["bookkeeping_s"] > 0 and rt["layer_residual_s"] >= 0
    assert cm.layer_overhead_s == pytest.approx(
        rt["routing_sync_s"] + rt["bookkeeping_s"] + rt["layer_residual_s"]
    )
    assert (
        cm.profile.runtime["cpu_call_s"] >= 0 and cm.cpu_call_in_replay_s == cm.profile.runtime["cpu_call_s"]
    )
    # no copies on a CPU device: nothing shares host memory with a CPU call
    assert (
        not cm.contention_from_stall and cm.cpu_slowdown_beside_copies == cm.copies_slowdown_beside_cpu == 0.0
    )
    assert cm.cpu_busy_gpu_s == rt["cpu_busy_gpu_s"] == 0.0  # no GPU here to be busy beside a CPU call


@pytest.mark.parametrize(
    "device_name, name",
    [
        ("NVIDIA H100 80GB HBM3", "h100-mini"),
        ("NVIDIA H200", "h200-mini"),
        ("NVIDIA GeForce RTX 5090", "rtx5090-mini"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000-mini"),
        ("NVIDIA A100-SXM4-80GB", "a100-mini"),
        (None, "cpu-mini"),
    ],
)
def test_a_profile_is_named_after_the_gpu_that_measured_it(device_name, name):
    assert default_profile_name(device_name, "llada2-mini") == name


def test_windows_cover_a_large_arena():
    from dllm_offload_sim.runtime.grouped import MAX_GROUPS, _window_bounds
    import numpy as np

    slots = np.array([3, 900, 1500, 2100, 2101])
    counts = np.array([2, 1, 4, 1, 3])
    wins = _window_bounds(slots, counts)
    assert all(hi - lo <= MAX_GROUPS for lo, hi, *_ in wins)
    assert [(a, b) for _, _, a, b, _ in wins] == [
        (0, 2),
        (2, 3),
        (3, 7),
        (7, 11),
    ]  # 3 | 900 | 1500 | 2100, 2101
    for lo, hi, a, b, offs in wins:
        assert offs[-1] == b - a and len(offs) == hi - lo


@pytest.mark.parametrize(
    "name",
    [
        "naive_lru",
        "oled",
        "ktransformers",
        "belady",
        "clairvoyant_coop",
        "belady_shared",
        "moe_infinity",
        "finemoe",
    ],
)
def test_replay_counters_equal_the_simulator(tmp_path, name):
    """The validator's replay (here on the CPU) takes exactly the simulator's decisions; prefetching
    policies follow the simulator's prefetch schedule, so their counters agree too."""
    import numpy as np

    from dllm_offload_sim.policies.belady import BeladyPolicy
    from dllm_offload_sim.policies.belady_shared import SharedBeladyPolicy
    from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
    from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from tests.simkit import flat_cost, random_request, write_requests
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import fidelity_rows

    from dllm_offload_sim.policies.finemoe import FineMoEPolicy
    from dllm_offload_sim.policies.moe_infinity import MoEInfinityPolicy
    from dllm_offload_sim.validate.comparison import COUNTERS

    make = {
        "naive_lru": NaiveLRUPolicy,
        "oled": OLEDPolicy,
        "ktransformers": KTransformersPolicy,
        "belady": BeladyPolicy,
        "clairvoyant_coop": lambda: BeladyPolicy(dispatch="coop"),
        "belady_shared": SharedBeladyPolicy,
        "moe_infinity": MoEInfinityPolicy,
        "finemoe": lambda: FineMoEPolicy(prefetch_distance=0),
    }[name]
    topo = tiny_topology(n_moe=4, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    path = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    rows, fwd, _ = fidelity_rows(Trace.open(path), make, name, 3, flat_cost(topo), [0, 1], device="cpu")
    counters = {r["metric"]: r for r in rows if r["metric"] in COUNTERS}
    from dllm_offload_sim.validate.fidelity import REPLAY_COLUMNS

    measured = fwd[[f"measured_{k}" for k in REPLAY_COLUMNS]]
    assert (measured >= 0).all().all() and (fwd.measured_host_issue_s > 0).all()  # every forward issued work
    assert (
        (fwd.predicted_cpu_path_s > 0) == (fwd.to_cpu > 0)
    ).all()  # a CPU path exactly where CPU experts ran
    assert ((fwd.measured_cpu_compute_s > 0) == (fwd.to_cpu > 0)).all()
    assert (
        (fwd.measured_cpu_start_delay_s > 0) == (fwd.to_cpu > 0)
    ).all()  # the worker started after the submit
    assert (fwd.measured_eager_calls == 0).all()  # one slot block: every grouped call went through its graph
    assert len(counters) == 4 and all(r["predicted"] == r["measured"] for r in counters.values()), counters
    if name in ("moe_infinity", "finemoe"):
        assert counters["prefetch_copies"]["predicted"] > 0  # the schedule was exercised
        assert fwd.measured_prefetch_issue_s.sum() > 0  # and its host time measured apart
    else:  # no prefetches: only the schedule's markers, a small share of the host's work (timing: a loose bound)
        assert fwd.measured_prefetch_issue_s.sum() < 0.25 * fwd.measured_host_issue_s.sum()
    assert all(r["charged_policy_us_per_layer"] > 0 for r in rows)  # decision time charged in the prediction
    launch = next(r for r in rows if r["metric"] == "host_launch_us")
    assert (
        launch["measured"] > 0 and launch["predicted"] != launch["predicted"]
    )  # the test profile has no stamp
    mem = next(
        r for r in rows if r["metric"] == "host_mem_gbps"
    )  # probed before the replay; the profile has none
    assert mem["measured_min"] <= mem["measured"] <= mem["measured_max"] and mem["measured"] > 0
    assert mem["predicted"] != mem["predicted"]


def test_repeated_replays_keep_the_median_and_the_range(tmp_path):
    """``repeats``: each repeat replays with a fresh policy and engine; the measured TPOT is the median
    repeat's, inside the kept range, and the counters hold in every repeat."""
    import numpy as np
    import pytest as _pytest

    from dllm_offload_sim.policies.oled import OLEDPolicy
    from tests.simkit import flat_cost, random_request, write_requests
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import COUNTERS, fidelity_rows

    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(1), 0, topo, 7, 3)])
    rows, fwd, _ = fidelity_rows(
        Trace.open(path), OLEDPolicy, "oled", 3, flat_cost(topo), [0], device="cpu", repeats=3
    )
    by = {r["metric"]: r for r in rows}
    t = by["tpot_ms"]
    assert t["repeats"] == 3 and 0 < t["measured_min"] <= t["measured"] <= t["measured_max"]
    for c in COUNTERS:  # deterministic decisions: the same counts in each repeat, equal to the prediction
        assert by[c]["measured_min"] == by[c]["measured_max"] == by[c]["predicted"] == by[c]["measured"]
    assert len(fwd) == len(set(fwd.forward))  # one repeat's per-forward table, not three stacked
    with _pytest.raises(ValueError, match="repeats must be >= 1"):
        fidelity_rows(Trace.open(path), OLEDPolicy, "oled", 3, flat_cost(topo), [0], device="cpu", repeats=0)


def test_fidelity_figure_from_a_table(tmp_path, capsys):
    import pandas as pd

    from dllm_offload_sim.validate.figure import main as figure_main

    rows = [
        {"policy": p, "cache": c, "metric": m, "predicted": v * 1.04, "measured": v}
        for p, v in (("lru", 20.0), ("oled", 10.0))
        for c in (40, 100)
        for m in ("tpot_ms", "prefill_ms")
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "f.csv", index=False)
    assert figure_main([str(tmp_path / "f.csv"), "--out", str(tmp_path / "fig")]) == 0
    assert "median |error| 4.0%" in capsys.readouterr().out
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").stat().st_size > 0
    pd.DataFrame([{"policy": "x"}]).to_csv(tmp_path / "bad.csv", index=False)
    assert figure_main([str(tmp_path / "bad.csv")]) == 2
    assert "not a fidelity table" in capsys.readouterr().err


def test_fidelity_figure_draws_the_repeats_range(tmp_path, monkeypatch):
    """A run replayed more than once gets a horizontal bar from its measured min to max; others none."""
    import matplotlib.axes
    import pandas as pd

    from dllm_offload_sim.validate.figure import plot_fidelity

    bars = []
    real = matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "errorbar",
        lambda self, x, y, xerr=None, **kw: (
            bars.append((list(x), [list(e) for e in xerr])) or real(self, x, y, xerr=xerr, **kw)
        ),
    )
    rows = [
        {
            "policy": "oled",
            "cache": 40,
            "metric": "tpot_ms",
            "predicted": 9.0,
            "measured": 10.0,
            "measured_min": 9.5,
            "measured_max": 11.0,
        },
        {
            "policy": "lru",
            "cache": 40,
            "metric": "tpot_ms",
            "predicted": 20.0,
            "measured": 21.0,
            "measured_min": float("nan"),
            "measured_max": float("nan"),
        },
    ]
    plot_fidelity(pd.DataFrame(rows), tmp_path / "fig")
    assert bars == [([10.0], [[0.5], [1.0]])]  # oled only: 10 - 9.5 to the left, 11 - 10 to the right


def test_pipelined_timing_path_runs_its_rounds(monkeypatch):
    """The CUDA-only pipelined branch of median_seconds, driven with fake events (no GPU here)."""
    import dllm_offload_sim.runtime.timing as T

    class FakeEvent:
        clock = 0.0

        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self, stream=None):
            FakeEvent.clock += 1.0
            self.t = FakeEvent.clock

        def synchronize(self):
            pass

        def elapsed_time(self, other):  # ms
            return (other.t - self.t) * 10.0

    monkeypatch.setattr(T.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(T.torch.cuda, "synchronize", lambda *a: None)
    calls = []
    got = T.median_seconds(lambda: calls.append(1), "cuda", reps=4, warmup=2, pipelined=True, rounds=3)
    assert len(calls) == 2 + 3 * 4 and got == pytest.approx(10.0 / 1e3 / 4)
    assert T.interleaved_medians([lambda: 1, lambda: 2], lambda fn: float(fn()), passes=3) == [1.0, 2.0]


def test_graphed_call_over_each_block_adds_up_to_the_eager_call():
    """The grouped call of ``runtime.grouped_graph`` (the replay's, captured as a CUDA graph on a GPU; the
    same code eagerly here) adds exactly the pairs whose slot lies in its block; pairs elsewhere or without
    a slot only touch the scratch row. Summed over the blocks it equals the eager call over the whole arena."""
    import numpy as np

    from dllm_offload_sim.runtime.grouped_graph import GroupedGraph, window_of

    H, I, E, k, T, n_slots = 16, 8, 40, 4, 7, 2 * MAX_GROUPS
    g = torch.Generator().manual_seed(3)
    pool = SlotPool(n_slots, H, I, dtype=torch.float32)
    rng = np.random.default_rng(3)
    slots = rng.choice(n_slots, size=30, replace=False)  # experts 30..39 have no slot
    lut = np.full(E, -1, np.int64)
    lut[:30] = slots
    pool.w13[torch.from_numpy(slots)] = torch.randn(30, 2 * I, H, generator=g)
    pool.w2[torch.from_numpy(slots)] = torch.randn(30, H, I, generator=g)
    x = torch.randn(T, H, generator=g)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int64)
    w = rng.random((T, k)).astype(np.float32)
    ref = grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, lut, n_slots, "cpu"), backend="loop")
    out_ext = torch.zeros(T + 1, H)
    for b in range(2):
        gg = GroupedGraph(x, out_ext, k, E, (b * MAX_GROUPS, MAX_GROUPS), pool.w13, pool.w2)
        assert not gg.graphed  # no CUDA here: the same code runs eagerly
        gg.run(ids, w, lut)
        if b == 0:  # after the first block, only its experts' pairs are in
            in0 = np.where((lut[ids] >= 0) & (lut[ids] < MAX_GROUPS), ids, 0)
            part = grouped_ffn(
                x,
                pool.w13,
                pool.w2,
                plan_from_numpy(in0, np.where(in0 == ids, w, 0), lut, n_slots, "cpu"),
                backend="loop",
            )
            torch.testing.assert_close(out_ext[:T], part, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out_ext[:T], ref, rtol=1e-4, atol=1e-4)
    assert window_of(np.array([3, 511])) == 0 and window_of(np.array([512, 700])) == 1
    assert window_of(np.array([3, 512])) is None  # spans two blocks: the replay's eager path
    with pytest.raises(ValueError, match="window"):
        GroupedGraph(x, out_ext, k, E, (MAX_GROUPS, MAX_GROUPS + 1), pool.w13, pool.w2)
    with pytest.raises(ValueError, match="scratch row"):
        GroupedGraph(x, torch.zeros(T, H), k, E, (0, 8), pool.w13, pool.w2)
    with pytest.raises(ValueError, match="do not match"):
        gg.run(ids[:, :2], w, lut)


@pytest.mark.parametrize(
    "L,C,E,spill",
    [
        (19, 40, 256, 256),
        (19, 100, 256, 256),
        (19, 256, 256, 256),
        (31, 100, 256, 112),
        (19, 20, 256, 0),
        (4, 0, 8, 8),
    ],
)
def test_block_layout_keeps_each_layer_and_its_copies_in_one_block(L, C, E, spill):
    """``block_layout`` packs homes into MAX_GROUPS-slot blocks with spare slots; a layer at its capacity
    that copies up to ``spill`` more experts keeps them all in its home's block (one graph per call)."""
    import numpy as np

    from dllm_offload_sim.runtime.grouped_graph import window_of
    from dllm_offload_sim.runtime.slot_pool import block_layout

    W = MAX_GROUPS
    homes, n_slots = block_layout(L, C, spill, W, min_free=E)
    assert len(homes) == L and n_slots >= L * C + E
    for a, b in homes:
        assert b - a == C and 0 <= a and b <= n_slots and (C == 0 or a // W == (b - 1) // W)
    assert len(set(homes)) == L or C == 0
    p = SlotPool(n_slots, 2, 2, dtype=torch.float32, home=homes, window=W)
    rng = np.random.default_rng(0)
    for _ in range(3):
        for j in range(L):
            p.set_layer(j, rng.choice(E, size=C, replace=False))
        for j in range(L):  # one layer at a time copies experts beyond its home, then trims back
            extra = [e for e in range(E) if e not in p.resident(j)][: min(spill, E - C)]
            for e in extra:
                p.assign(j, e)
            s = np.array([p.lookup(j, e) for e in p.resident(j)])
            assert len(s) == 0 or window_of(s) is not None, (j, s.min(), s.max())
            for e in extra:
                p.evict(j, e)
    p.check()
    with pytest.raises(ValueError, match="do not fit"):
        block_layout(2, W + 1, 0, W)


def test_arena_layout_shrinks_the_spill_to_fit_memory_and_names_what_does_not_fit(monkeypatch):
    """The replay's slot arena takes the full spill area where memory allows, a smaller one where it
    does not, and fails with an error naming the model, the cache and the memory when even the minimum
    (every layer's cache plus one layer's experts) does not fit."""
    import dllm_offload_sim.runtime.arena as R
    from dllm_offload_sim.runtime.slot_pool import block_layout

    topo = tiny_topology(n_moe=4, n_experts=256)
    per, C = topo.expert_bytes, 200
    full = block_layout(4, C, 256, MAX_GROUPS, min_free=256)[
        1
    ]  # one layer per block, each with 256 spare slots
    minimum = 4 * C + 256
    assert full > minimum
    page = 4096

    def free_bytes(n):
        monkeypatch.setattr(R.os, "sysconf", lambda k: page if k == "SC_PAGE_SIZE" else n // page)

    free_bytes(10 * full * per)
    assert R.arena_layout(topo, C, 4 * C, "cpu")[1] == full
    free_bytes(int((minimum + 100) * per / R.ARENA_MEMORY_SHARE) + page)
    homes, n = R.arena_layout(topo, C, 4 * C, "cpu")
    assert minimum <= n < full and len(homes) == 4
    free_bytes(int(minimum * per / 2))
    with pytest.raises(MemoryError, match=f"{topo.name} at Cache {C}"):
        R.arena_layout(topo, C, 4 * C, "cpu")


def test_the_residual_splits_into_a_part_per_moe_layer_and_a_part_per_forward(tmp_path):
    """On probes whose measured forwards take exactly what the simulator charges them under full residency plus 30 us
    per MoE layer and 80 us per forward, a two- and a four-layer cut give back 30 and 80 us; without the deeper cut the
    whole excess is per layer; a probe faster than the model gives 0 (the terms never credit time back). The
    simulator's charge is the resident layer's: non-expert work, the per-layer overhead, one grouped call over the
    active experts, plus the dense layer and the lm-head."""
    import pandas as pd

    from dllm_offload_sim.profiler.runtime_overhead import (
        moe_layer_cut,
        residual_split,
        synthetic_decode_forwards,
    )
    from tests.simkit import flat_cost

    topo = tiny_topology(n_moe=4, n_experts=8)
    cost = flat_cost(topo)

    def probe(n, per_layer, per_forward):
        cut = moe_layer_cut(topo, n)
        fwds = synthetic_decode_forwards(cut, 6, 4, 16, warmup=2)

        def model(f):
            m = cost.dense_layer_seconds(f.n_tokens, f.kv_len) + cost.per_forward_seconds(f.n_tokens)
            for j in range(cut.n_moe_layers):
                m += cost.non_expert_seconds(f.n_tokens, f.kv_len) + cost.layer_overhead_s
                m += cost.grouped_call_seconds(int((f.counts[j] > 0).sum()), f.n_tokens * cut.top_k)[0]
            return m

        measured = [f for f in fwds if f.measured]
        pf = pd.DataFrame(
            {
                "forward": [f.index for f in measured],
                "policy_s": 1e-6,
                "duration_s": [model(f) + 1e-6 + n * per_layer + per_forward for f in measured],
            }
        )
        return cut, fwds, pf

    assert residual_split(probe(2, 3e-5, 8e-5), probe(4, 3e-5, 8e-5), cost) == pytest.approx((3e-5, 8e-5))
    assert residual_split(probe(2, 3e-5, 8e-5), None, cost) == pytest.approx((7e-5, 0.0))  # (2 x 30 + 80) / 2
    assert residual_split(probe(2, -1e-4, 0.0), probe(4, -1e-4, 0.0), cost) == pytest.approx((0.0, 0.0))
    with pytest.raises(ValueError, match="must be deeper"):
        residual_split(probe(2, 0.0, 0.0), probe(2, 0.0, 0.0), cost)


def test_the_deep_residual_probe_takes_the_deepest_cut_the_device_holds(monkeypatch):
    from dllm_offload_sim.profiler import runtime_overhead as ro

    tried = []

    def probe(topo, cost, device, dtype, moe_layers=2):
        tried.append(moe_layers)
        if moe_layers > 4:
            raise MemoryError("arena")
        return ("cut", moe_layers)

    monkeypatch.setattr(ro, "full_residency_probe", probe)
    assert ro.deep_residual_probe(tiny_topology(n_moe=19, n_experts=8), None, "cpu") == ("cut", 4)
    assert tried == [6, 5, 4]
    assert (
        ro.deep_residual_probe(tiny_topology(n_moe=2, n_experts=8), None, "cpu") is None
    )  # nothing deeper than 2
    monkeypatch.setattr(
        ro, "full_residency_probe", lambda *a, **k: (_ for _ in ()).throw(MemoryError("arena"))
    )
    assert ro.deep_residual_probe(tiny_topology(n_moe=19, n_experts=8), None, "cpu") is None  # no cut fits


def test_the_cut_probes_alternate_and_pool_their_parts(monkeypatch):
    """Each probe is timed in parts, in the order resident, deep, CPU, then CPU, deep, resident (a drift of the host's
    speed falls on all alike); the first deep part finds the deepest cut that fits, the later ones reuse its depth;
    each result holds its parts' measured rows and replays the same forwards."""
    import pandas as pd

    from dllm_offload_sim.profiler import runtime_overhead as ro

    calls = []

    def rows(forwards, warmup):
        return pd.DataFrame({"part": [len(calls)] * (forwards - warmup)})

    def resident(topo, cost, device, dtype, forwards=24, warmup=4, moe_layers=2):
        if moe_layers > 4:
            raise MemoryError("arena")
        calls.append((moe_layers, forwards, warmup))
        return ro.moe_layer_cut(topo, moe_layers), f"forwards of {moe_layers}", rows(forwards, warmup)

    def cpu(topo, cost, device, dtype, forwards=24, warmup=4):
        calls.append(("cpu", forwards, warmup))
        return "cpu forwards", 5, rows(forwards, warmup)

    monkeypatch.setattr(ro, "full_residency_probe", resident)
    monkeypatch.setattr(ro, "cpu_call_probe", cpu)
    got = ro.cut_probes(tiny_topology(n_moe=19, n_experts=8), None, "cpu", forwards=24, warmup=4, rounds=4)
    # the 6- and 5-layer cuts did not fit
    assert [c[0] for c in calls] == [2, 4, "cpu", "cpu", 4, 2, 2, 4, "cpu", "cpu", 4, 2]
    assert {c[1:] for c in calls} == {(9, 4)}  # 20 measured forwards over 4 rounds, after 4 warm-up ones each
    assert got.resident[0].n_moe_layers == 2 and got.deep[0].n_moe_layers == 4
    assert (
        got.resident[1] == "forwards of 2"
        and got.deep[1] == "forwards of 4"
        and got.cpu[:2] == ("cpu forwards", 5)
    )
    assert sorted(got.resident[2].part) == [1] * 5 + [6] * 5 + [7] * 5 + [12] * 5
    assert sorted(got.deep[2].part) == [2] * 5 + [5] * 5 + [8] * 5 + [11] * 5
    assert sorted(got.cpu[2].part) == [3] * 5 + [4] * 5 + [9] * 5 + [10] * 5
    calls.clear()
    got = ro.cut_probes(tiny_topology(n_moe=2, n_experts=8), None, "cpu", rounds=2)
    assert got.deep is None and [c[0] for c in calls] == [
        2,
        "cpu",
        "cpu",
        2,
    ]  # no cut deeper than two MoE layers

    def second_deep_fails(topo, cost, device, dtype, forwards=24, warmup=4, moe_layers=2):
        if moe_layers == 4 and any(c[0] == 4 for c in calls):
            raise MemoryError("arena")
        return resident(topo, cost, device, dtype, forwards, warmup, moe_layers)

    calls.clear()
    monkeypatch.setattr(ro, "full_residency_probe", second_deep_fails)
    got = ro.cut_probes(tiny_topology(n_moe=19, n_experts=8), None, "cpu", forwards=24, warmup=4, rounds=2)
    assert [c[0] for c in calls] == [2, 4, "cpu", "cpu", 2]  # the second deep part did not fit: left out
    assert sorted(got.deep[2].part) == [2] * 10 and len(got.resident[2]) == 20


def test_the_simulator_charges_the_forward_residual_once_per_forward(tmp_path):
    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
    from dllm_offload_sim.sim.run import simulate
    from tests.simkit import flat_profile, random_request, write_requests

    topo = tiny_topology(n_moe=3, n_experts=8)
    trace = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 3)])
    prof = flat_profile(topo)
    base = simulate(trace, FullResidencyPolicy(), 8, CostModel(prof)).per_forward
    prof.runtime = {"forward_residual_s": 2e-4}
    more = simulate(trace, FullResidencyPolicy(), 8, CostModel(prof)).per_forward
    assert (more.duration_s - base.duration_s).to_numpy() == pytest.approx(np.full(len(base), 2e-4))
    assert (more.nonexpert_s - base.nonexpert_s).to_numpy() == pytest.approx(np.full(len(base), 2e-4))


def test_preparing_a_replay_twice_keeps_its_graphs_and_cache():
    """``prepare`` then ``run`` (which prepares again) builds nothing twice: the KV cache the captured graphs write
    stays the one they were captured with."""
    import numpy as np

    from dllm_offload_sim.policies.base import PolicyContext
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.profiler.runtime_overhead import synthetic_decode_forwards
    from dllm_offload_sim.runtime.replay import ReplayEngine
    from tests.simkit import flat_cost

    topo = tiny_topology(n_moe=2, n_experts=8)
    cost = flat_cost(topo)
    fwds = synthetic_decode_forwards(topo, 3, 2, 8, warmup=0)
    eng = ReplayEngine(
        topo,
        ResidencyDriver(FullResidencyPolicy(), PolicyContext.of(topo, 8, cost)),
        cost,
        device="cpu",
        dtype=torch.float32,
        cpu_engine="torch",
    )
    try:
        eng.prepare(fwds)
        kv, graphs = eng.graphs.kv, dict(eng.graphs.graphs)
        pf = eng.run(fwds, lambda b: None)
        assert (
            eng.graphs.kv is kv
            and eng.graphs.graphs == graphs
            and len(pf) == 3
            and np.isfinite(pf.duration_s).all()
        )
    finally:
        eng.close()


@pytest.mark.parametrize("n_experts", [8, 16])  # 8: fewer experts than the probe would plan prefetches of
def test_the_prefetch_probe_times_the_replays_host_work_per_prefetch_started(n_experts):
    """The probe replays the simulator's schedule of a prefetching probe policy on the two-MoE-layer cut (CPU here):
    its prefetches are copied, and their host time per copy is positive, well under a forward's time."""
    from dllm_offload_sim.profiler.runtime_overhead import prefetch_start_seconds
    from tests.simkit import flat_cost

    topo = tiny_topology(n_moe=2, n_experts=n_experts)
    v = prefetch_start_seconds(
        topo, flat_cost(topo), "cpu", torch.float32, forwards=6, warmup=2, tokens=4, kv_len=16
    )
    assert 0 < v < 0.05


def test_the_policy_time_probe_takes_half_the_experts_or_the_largest_cache_the_device_holds(monkeypatch):
    """The whole-stack probe replays at half the experts per layer; where that arena would exceed the replay's share
    of the device's memory (LLaDA2.0-flash on an 80 GB card), at the largest cache whose arena fits with a full
    spill area per block (so no grouped call runs eagerly), and never below one slot."""
    import dllm_offload_sim.runtime.arena as R
    from dllm_offload_sim.profiler.runtime_overhead import probe_cache
    from dllm_offload_sim.runtime.slot_pool import block_layout
    from dllm_offload_sim.traces.topology import FLASH

    L, E, per = FLASH.n_moe_layers, FLASH.n_experts, FLASH.expert_bytes
    monkeypatch.setattr(R, "free_device_bytes", lambda device: 10 * (L * E + E) * per)
    assert probe_cache(FLASH, E // 2, "cpu") == E // 2
    free = 64 * 2**30  # an 80 GB card with the profiler's other buffers
    monkeypatch.setattr(R, "free_device_bytes", lambda device: free)
    c = probe_cache(FLASH, E // 2, "cpu")
    assert 1 <= c < E // 2
    full_spill = lambda cache: block_layout(L, cache, E, MAX_GROUPS, E)[1] * per  # noqa: E731
    assert full_spill(c) <= R.ARENA_MEMORY_SHARE * free < full_spill(c + 1)
    assert R.arena_layout(FLASH, c, L * c, "cpu") == block_layout(
        L, c, E, MAX_GROUPS, E
    )  # the replay keeps it all
    monkeypatch.setattr(R, "free_device_bytes", lambda device: per)
    assert probe_cache(FLASH, E // 2, "cpu") == 1


def test_the_policy_time_factor_compares_the_replays_decisions_with_a_simulations():
    """The probe times the same LRU decisions in a replay and in a simulation on the two-MoE-layer cut (CPU here);
    the ratio is the replay's time per forward over the simulation's, 1 where the simulation measured none."""
    import math

    from dllm_offload_sim.profiler.runtime_overhead import decision_time_ratio, policy_time_factor
    from tests.simkit import flat_cost

    assert decision_time_ratio(3e-4, 1.5e-4) == pytest.approx(2.0)
    assert decision_time_ratio(3e-4, 0.0) == 1.0 and decision_time_ratio(float("nan"), 1e-4) == 1.0
    topo = tiny_topology(n_moe=2, n_experts=8)
    f = policy_time_factor(
        topo, flat_cost(topo), "cpu", torch.float32, forwards=6, warmup=2, tokens=4, kv_len=16
    )
    assert math.isfinite(f) and f > 0


def test_the_validator_charges_the_simulated_decision_time_times_the_profiles_factor(tmp_path):
    """A profile whose ``runtime.policy_time_factor`` is 3 makes the validator charge three times the decision time
    the simulation measured; the row keeps both, so a re-prediction under another factor can recompute the charge."""
    import dataclasses

    import numpy as np

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import fidelity_rows
    from tests.simkit import flat_profile, random_request, write_requests

    topo = tiny_topology(n_moe=3, n_experts=8)
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(1), 0, topo, 5, 3)])
    prof = flat_profile(topo)
    cost = CostModel(dataclasses.replace(prof, runtime={"policy_time_factor": 3.0}))
    rows, _, _ = fidelity_rows(Trace.open(path), LRUPolicy, "lru", 4, cost, [0], device="cpu")
    r = next(r for r in rows if r["metric"] == "tpot_ms")
    assert r["policy_time_factor"] == 3.0 and r["simulated_policy_us_per_layer"] > 0
    assert r["charged_policy_us_per_layer"] == pytest.approx(3.0 * r["simulated_policy_us_per_layer"])


def test_a_runs_repeats_share_one_cpu_engine_and_a_larger_forward_gets_a_larger_one(tmp_path, monkeypatch):
    """The repeats of a validation run replay on one CPU engine (building the native one packs every expert's
    weights); a sweep's shared engines hand the same engine to every replay whose forwards fit it, replace it with a
    larger one when a forward does not, and stop all of them on close."""
    import numpy as np

    import dllm_offload_sim.runtime.shared_cpu_engines as S
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.runtime.host_experts import HostExperts
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import fidelity_rows
    from tests.simkit import flat_cost, random_request, write_requests

    built, closed = [], []
    real = S.profiled_cpu_engine

    def counting(*a, **k):
        e = real(*a, **k)
        built.append(k["max_tokens"])
        close = e.close
        e.close = lambda: (closed.append(1), close())[1]
        return e

    monkeypatch.setattr(S, "profiled_cpu_engine", counting)
    topo = tiny_topology(n_moe=3, n_experts=8).with_widths(n_group=2, topk_group=1)
    path = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(1), 0, topo, 7, 3)])
    rows, _, _ = fidelity_rows(
        Trace.open(path), OLEDPolicy, "oled", 3, flat_cost(topo), [0], device="cpu", repeats=3
    )
    assert next(r for r in rows if r["metric"] == "tpot_ms")["repeats"] == 3
    assert len(built) == 1 and closed == [1]  # one engine for the three repeats, stopped at the end

    built.clear(), closed.clear()
    shared, host, cost = S.SharedCpuEngines(), HostExperts(topo, n_real_layers=1, pin=False), flat_cost(topo)
    a = shared.get(cost, host, "cpu", "torch", 1, 16)
    assert shared.get(cost, host, "cpu", "torch", 1, 8) is a  # fits: the same engine
    assert shared.first_lending(a) and not shared.first_lending(a)  # a caller may warm an engine once
    b = shared.get(cost, host, "cpu", "torch", 1, 64)
    assert b is not a and built == [16, 64] and closed == [1]  # too small: replaced
    assert shared.first_lending(b)
    shared.close()
    assert closed == [1, 1]


def test_replays_share_the_non_expert_graphs_captured_once_and_count_as_alone():
    """Two replays (other policies, other caches) lent one ``ReplayGraphs`` capture its graphs once: the second
    adds none, closing a replay keeps them, and each replay's counters are those of a replay with graphs of its own.
    Graphs of another topology are refused."""
    import numpy as np

    from dllm_offload_sim.policies.base import PolicyContext
    from dllm_offload_sim.policies.full_residency import FullResidencyPolicy
    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.policies.residency import ResidencyDriver
    from dllm_offload_sim.profiler.runtime_overhead import synthetic_decode_forwards
    from dllm_offload_sim.runtime.replay import ReplayEngine
    from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
    from tests.simkit import flat_cost

    topo = tiny_topology(n_moe=2, n_experts=8)
    cost = flat_cost(topo)
    fwds = synthetic_decode_forwards(topo, 4, 2, 8, warmup=0)
    counters = ["hits", "misses", "to_gpu", "to_cpu"]

    def replay(policy, cache, graphs=None):
        eng = ReplayEngine(
            topo,
            ResidencyDriver(policy, PolicyContext.of(topo, cache, cost)),
            cost,
            device="cpu",
            dtype=torch.float32,
            cpu_engine="torch",
            graphs=graphs,
        )
        try:
            return eng.run(fwds, lambda b: None)[counters]
        finally:
            eng.close()

    shared = ReplayGraphs(topo, "cpu", torch.float32)
    a = replay(FullResidencyPolicy(), 8, shared)
    captured = dict(shared.graphs)
    assert len(captured) == len({(f.n_tokens, f.kv_len) for f in fwds}) and shared.kv is not None
    b = replay(LRUPolicy(), 3, shared)
    assert shared.graphs == captured  # the same graph objects: nothing captured again
    assert a.equals(replay(FullResidencyPolicy(), 8)) and b.equals(replay(LRUPolicy(), 3))
    assert b.to_gpu.sum() > 0 and np.all(a.to_gpu == 0)
    for T, (_, out_ext) in shared.x.items():  # the CPU result's add goes into the output's first T rows, kept
        rows = shared.rows[T]
        assert rows.data_ptr() == out_ext.data_ptr() and tuple(rows.shape) == (T, topo.hidden)
    with pytest.raises(ValueError, match="lent graphs are for"):
        ReplayEngine(
            tiny_topology(n_moe=2, n_experts=16),
            ResidencyDriver(
                FullResidencyPolicy(), PolicyContext.of(tiny_topology(n_moe=2, n_experts=16), 8, cost)
            ),
            cost,
            device="cpu",
            dtype=torch.float32,
            graphs=shared,
        )
    shared.close()
    assert shared.graphs == {} and shared.rows == {} and shared.kv is None


def test_the_simulator_charges_the_host_steps_beside_the_cpu_engine(tmp_path):
    """``runtime.bookkeeping_cpu_s`` is charged in each MoE layer that follows one with a CPU call (its excess over
    ``bookkeeping_s``) and ``grouped_issue_cpu_s`` issues the grouped calls of a layer with a CPU call; a policy that
    runs nothing on the CPU is charged neither."""
    from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.sim.run import simulate
    from tests.simkit import flat_profile, random_request, write_requests

    topo = tiny_topology(n_moe=3, n_experts=8)
    trace = write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 6, 3)])
    prof = flat_profile(topo)
    prof.runtime = {"bookkeeping_s": 1e-5}
    base = simulate(trace, KTransformersPolicy(), 2, CostModel(prof), record_layers=True)
    lru = simulate(trace, LRUPolicy(), 2, CostModel(prof)).per_forward
    prof.runtime = {"bookkeeping_s": 1e-5, "bookkeeping_cpu_s": 4e-4, "grouped_issue_cpu_s": 0.0}
    more = simulate(trace, KTransformersPolicy(), 2, CostModel(prof)).per_forward
    cpu = base.layers.sort_values(["forward", "layer"]).to_cpu.to_numpy() > 0
    assert cpu.any()
    after = np.concatenate([[False], cpu[:-1]])  # each layer after one with a CPU call, across forwards
    per_forward = np.add.reduceat(after, np.arange(0, len(after), topo.n_moe_layers))
    assert per_forward.sum() > 0
    assert (more.duration_s - base.per_forward.duration_s).to_numpy() == pytest.approx(per_forward * 3.9e-4)
    assert simulate(
        trace, LRUPolicy(), 2, CostModel(prof)
    ).per_forward.duration_s.to_numpy() == pytest.approx(lru.duration_s.to_numpy())
    cm = CostModel(prof)
    prof.runtime["grouped_issue_s"] = 2e-4
    cm2 = CostModel(prof)
    assert cm.grouped_call_seconds(4, 8) == cm.grouped_call_seconds(
        4, 8, beside_cpu=True
    )  # no issue cost either way
    assert cm2.grouped_call_seconds(4, 8)[0] == pytest.approx(cm.grouped_call_seconds(4, 8)[0] + 2e-4)
    assert cm2.grouped_call_seconds(4, 8, beside_cpu=True) == cm.grouped_call_seconds(
        4, 8
    )  # beside the engine: 0


def test_a_grouped_calls_issue_is_timed_over_the_forwards_without_eager_calls():
    """``grouped_issue_per_call`` reads the forwards whose calls all replayed their graphs (an eager call is another,
    costlier path), all of them where every forward made one; ``beside_engine_terms`` takes the CPU-miss probe's
    bookkeeping per MoE layer and scales the whole stack's grouped issue by that probe's over the resident one's."""
    import pandas as pd

    from dllm_offload_sim.profiler.runtime_overhead import beside_engine_terms, grouped_issue_per_call

    rows = pd.DataFrame(
        {"grouped_issue_s": [4e-5, 6e-5, 3e-3], "grouped_calls": [2, 2, 2], "eager_calls": [0, 0, 1]}
    )
    assert grouped_issue_per_call(rows) == pytest.approx(2.5e-5)
    assert grouped_issue_per_call(rows.assign(eager_calls=1)) == pytest.approx(3e-5)
    assert np.isnan(grouped_issue_per_call(rows.assign(grouped_calls=0)))  # no call issued
    cut = tiny_topology(n_moe=2, n_experts=8)
    resident = (
        cut,
        None,
        pd.DataFrame(
            {
                "bookkeeping_s": [2e-5, 4e-5],
                "grouped_issue_s": [4e-5, 4e-5],
                "grouped_calls": [2, 2],
                "eager_calls": [0, 0],
            }
        ),
    )
    cpu = (
        None,
        4,
        pd.DataFrame(
            {
                "bookkeeping_s": [1e-4, 1.2e-4, 1.4e-4],
                "grouped_issue_s": [8e-5] * 3,
                "grouped_calls": [2] * 3,
                "eager_calls": [0] * 3,
            }
        ),
    )
    terms = beside_engine_terms(resident, cpu, 1e-4)
    assert terms == pytest.approx({"bookkeeping_cpu_s": 6e-5, "grouped_issue_cpu_s": 2e-4})
    assert set(beside_engine_terms(resident, (None, 4, cpu[2].assign(grouped_calls=0)), 1e-4)) == {
        "bookkeeping_cpu_s"
    }
