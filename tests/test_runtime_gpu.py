"""Runtime primitives on a CUDA GPU (run on the device; skipped elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_offload_sim.traces.topology import MINI
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.grouped import grouped_ffn, plan_from_numpy, routing_plan
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool

pytestmark = pytest.mark.gpu


def _mini_pool(n_slots=64):
    host = HostExperts(MINI, n_real_layers=1)
    pool = SlotPool(n_slots, MINI.hidden, MINI.moe_intermediate, device="cuda")
    cp = ExpertCopier(host, pool, "cuda")
    slots = [pool.assign(1, e) for e in range(n_slots)]
    ev = cp.demand(1, list(range(n_slots)), slots)
    torch.cuda.current_stream().wait_event(ev)
    return host, pool


def test_copies_land_in_their_slots():
    host, pool = _mini_pool(8)
    torch.cuda.synchronize()
    for e in range(8):
        assert torch.equal(pool.w13[pool.lookup(1, e)].cpu(), host.expert(1, e)[0])
        assert torch.equal(pool.w2[pool.lookup(1, e)].cpu(), host.expert(1, e)[1])
    assert host.pinned


def test_batched_copies_land_where_torch_copies_do():
    """The copier's copies (a batch of six through ``cudaMemcpyBatchAsync``, three with one ``cudaMemcpyAsync`` each) put
    every expert of every layer where one torch copy each does."""
    host = HostExperts(MINI, n_real_layers=2)
    pools = [SlotPool(12, MINI.hidden, MINI.moe_intermediate, device="cuda") for _ in range(2)]
    cps = [ExpertCopier(host, pools[0], "cuda"), ExpertCopier(host, pools[1], "cuda", batch=False)]
    assert cps[0].batch is not None and cps[1].batch is None
    for cp in cps:
        cp.demand(0, [5, 1, 9, 200, 17, 3], [0, 2, 4, 6, 8, 10])
        cp.demand(3, [5, 255, 64], [1, 3, 5])
    torch.cuda.synchronize()
    assert torch.equal(pools[0].flat, pools[1].flat)
    assert torch.equal(pools[0].slot_flat[3].cpu(), host.expert_flat(3, 255))


@pytest.mark.parametrize("backend", ["grouped_mm", "bmm"])
def test_grouped_matches_per_expert_at_mini_shape(backend):
    if backend == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch._grouped_mm not in this torch")
    host, pool = _mini_pool(64)
    g = torch.Generator(device="cuda").manual_seed(0)
    T = 16
    x = torch.randn(T, MINI.hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    ids = torch.stack([torch.randperm(60, device="cuda", generator=g)[:8] for _ in range(T)])
    w = torch.rand(T, 8, device="cuda", generator=g).to(torch.bfloat16)
    plan = routing_plan(ids, w, pool.slot_lut(1, 256, "cuda"), 64)
    ref = grouped_ffn(x.float(), pool.w13.float(), pool.w2.float(), plan, backend="loop")
    got = grouped_ffn(x, pool.w13, pool.w2, plan, backend=backend).float()
    err = (got - ref).abs().max().item() / ref.abs().max().item()
    assert err < 2e-2, f"relative error {err}"


def test_plan_uploaded_in_one_pinned_copy_equals_the_device_plan():
    g = torch.Generator().manual_seed(1)
    n_slots = 1300  # three grouped_mm windows
    ids = torch.stack([torch.randperm(256, generator=g)[:8] for _ in range(24)]).numpy()
    w = torch.rand(24, 8, generator=g).numpy()
    lut = np.full(256, -1, np.int64)
    lut[::2] = np.linspace(0, n_slots - 1, 128).astype(np.int64)
    ref = routing_plan(
        torch.from_numpy(ids).cuda(), torch.from_numpy(w).cuda(), torch.from_numpy(lut).cuda(), n_slots
    )
    for _ in range(
        3
    ):  # buffers come back from torch's pinned allocator: later plans must not clobber earlier ones
        got = plan_from_numpy(ids, w, lut, n_slots, "cuda")
        other = plan_from_numpy(ids[::-1].copy(), w, lut, n_slots, "cuda")
        torch.cuda.synchronize()
        for f in ("token", "slot", "slots", "counts", "offs", "pair"):
            assert torch.equal(getattr(got, f).long(), getattr(ref, f).long()), f
        torch.testing.assert_close(got.weight, ref.weight)
        assert len(got.windows) > 1 and other.n_pairs == got.n_pairs


def test_end_to_end_offloading_on_the_gpu():
    """The e2e mode on CUDA (bf16): an all-GPU policy decodes the same tokens as full residency,
    and OLED (copies and CPU experts) runs and reports where it first differs, if anywhere."""
    from dllm_offload_sim.policies.base import CostHints
    from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from tests.test_model import tiny_config
    from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM
    from dllm_offload_sim.validate.e2e import run_e2e

    torch.manual_seed(0)
    m = LLaDA2MoeModelLM(tiny_config(vocab_size=300))
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    m = m.to("cuda", torch.bfloat16).eval()
    prompts = [[5, 17, 42, 7, 99, 3, 250, 11, 64, 8], [200, 100, 50, 25]]
    table, toks = run_e2e(
        m,
        prompts,
        [("naive_lru", NaiveLRUPolicy), ("oled", OLEDPolicy)],
        cache=3,
        cost_hints=CostHints.constant(h2d=1.0, cpu_per_token=0.3),
        max_new_tokens=24,
        block_length=8,
        threshold=0.5,
    )
    t = table.set_index("policy")
    assert t.loc["naive_lru"].lossless, t.to_string()
    assert t.loc["oled"].cpu_experts > 0 and t.loc["oled"].forwards > 0


@pytest.mark.parametrize("name", ["ktransformers", "oled", "moe_infinity"])
def test_replay_on_the_gpu_keeps_the_simulators_counters(tmp_path, name):
    """The replay on CUDA: CPU experts from the D2H stream (KTransformers, OLED) and prefetches along the
    simulator's schedule (MoE-Infinity) run, and every counter equals the simulator's."""
    import numpy as np

    from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
    from dllm_offload_sim.policies.moe_infinity import MoEInfinityPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from tests.simkit import flat_cost, random_request, tiny_topology, write_requests
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import COUNTERS, fidelity_rows

    make = {"ktransformers": KTransformersPolicy, "oled": OLEDPolicy, "moe_infinity": MoEInfinityPolicy}[name]
    topo = tiny_topology(n_moe=4, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    path = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    rows, _, _ = fidelity_rows(Trace.open(path), make, name, 3, flat_cost(topo), [0, 1], device="cuda")
    counters = {r["metric"]: r for r in rows if r["metric"] in COUNTERS}
    assert all(r["predicted"] == r["measured"] for r in counters.values()), counters


def test_grouped_graph_equals_the_eager_call_at_mini_shape():
    """The captured graph (plan on the GPU, grouped_mm over one slot block) reads each upload anew and
    equals the eager call over the same experts; pairs outside the block leave x's rows untouched."""
    from dllm_offload_sim.runtime.grouped import MAX_GROUPS
    from dllm_offload_sim.runtime.grouped_graph import GroupedGraph

    host = HostExperts(MINI, n_real_layers=1)
    n_slots = 2 * MAX_GROUPS
    pool = SlotPool(n_slots, MINI.hidden, MINI.moe_intermediate, device="cuda")
    rng = np.random.default_rng(0)
    slots = np.concatenate(
        [rng.choice(MAX_GROUPS, 100, replace=False), MAX_GROUPS + rng.choice(MAX_GROUPS, 60, replace=False)]
    )
    lut = np.full(256, -1, np.int64)
    lut[:160] = slots
    for e, s in enumerate(slots):
        pool.w13[s].copy_(host.expert(0, e)[0])
        pool.w2[s].copy_(host.expert(0, e)[1])
    T, k = 16, 8
    x = torch.randn(T, MINI.hidden, device="cuda", dtype=torch.bfloat16)
    out_ext = torch.zeros(T + 1, MINI.hidden, device="cuda", dtype=torch.bfloat16)
    gg = GroupedGraph(x, out_ext, k, 256, (0, MAX_GROUPS), pool.w13, pool.w2)
    assert gg.graphed
    for trial in range(3):
        ids = np.stack([rng.choice(256, k, replace=False) for _ in range(T)]).astype(np.int64)
        w = rng.random((T, k)).astype(np.float32)
        in_block = np.where((lut >= 0) & (lut < MAX_GROUPS), lut, -1)
        ref = grouped_ffn(x, pool.w13, pool.w2, plan_from_numpy(ids, w, in_block, n_slots, "cuda")).float()
        out_ext.zero_()
        gg.run(ids, w, lut)
        got = out_ext[:T].float()
        err = (got - ref).abs().max().item() / ref.abs().max().item()
        assert err < 2e-2, f"trial {trial}: relative error {err}"


def test_validation_runs_on_the_gpu_share_the_non_expert_graphs(tmp_path):
    """Two validation runs of a sweep (other policies and caches, 2 repeats each) lent one ``ReplayGraphs`` on CUDA:
    the second captures no graph, and both keep the simulator's counters in every repeat."""
    import numpy as np

    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
    from tests.simkit import flat_cost, random_request, tiny_topology, write_requests
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import COUNTERS, fidelity_rows

    topo = tiny_topology(n_moe=4, n_experts=8).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    trace = Trace.open(write_requests(tmp_path / "t", topo, [random_request(rng, 0, topo, 9, 3)]))
    graphs = ReplayGraphs(topo, "cuda")
    try:
        captured = None
        for make, cache in ((LRUPolicy, 3), (OLEDPolicy, 5)):
            rows, _, _ = fidelity_rows(
                trace,
                make,
                make.__name__,
                cache,
                flat_cost(topo),
                [0],
                device="cuda",
                repeats=2,
                replay_graphs=graphs,
            )
            counters = [r for r in rows if r["metric"] in COUNTERS]
            assert all(r["predicted"] == r["measured_min"] == r["measured_max"] for r in counters), counters
            captured = captured or dict(graphs.graphs)
            assert graphs.graphs == captured  # the same graph objects: none captured again
    finally:
        graphs.close()


def test_an_interleaved_sweep_on_the_gpu_keeps_every_runs_counters(tmp_path):
    """``validate.sweep.run_sweep`` on the GPU: two runs' repeats in rounds (one set of host experts, CPU engines
    and graphs for both), each run's counters equal to its simulation's in every repeat."""
    from dllm_offload_sim.policies.lru import LRUPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.comparison import COUNTERS
    from dllm_offload_sim.validate.run_store import RunStore
    from dllm_offload_sim.validate.sweep import SweepRun, SweepSettings, run_sweep
    from tests.simkit import flat_cost, random_request, tiny_topology, write_requests

    topo = tiny_topology(n_moe=4, n_experts=8).with_widths(n_group=2, topk_group=1)
    # 8 rows a forward: the CPU engine, sized for the largest forward, takes the probe's call over all 8 experts
    trace = Trace.open(
        write_requests(tmp_path / "t", topo, [random_request(np.random.default_rng(0), 0, topo, 9, 8)])
    )
    runs = [SweepRun("lru", LRUPolicy, 3, "a"), SweepRun("oled", OLEDPolicy, 5, "b")]
    seen, probes = [], []

    def replayed(r, k, rep):
        seen.append((r.label, k))
        probes.append(rep.summary["cpu_probe_ms"])

    results = run_sweep(
        runs,
        RunStore(tmp_path / "out"),
        trace,
        flat_cost(topo),
        [0],
        SweepSettings(repeats=2, device="cuda"),
        on_replay=replayed,
    )
    assert seen == [("lru", 0), ("oled", 0), ("lru", 1), ("oled", 1)]
    assert all(p > 0 for p in probes), probes  # the CPU engine's probe call before each replay
    for res in results:
        counters = [r for r in res.rows if r["metric"] in COUNTERS]
        assert all(r["predicted"] == r["measured_min"] == r["measured_max"] for r in counters), counters


def test_the_busy_gpu_probe_times_a_stream_ordered_call_on_the_gpus_clock():
    """The profiler's ``cpu_busy_gpu_seconds`` on the GPU: a finite extra >= 0 for a CPU call beside GPU matmuls that
    outlast it, its path read from the engine's timing events."""
    import math

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.profiler.runtime_overhead import cpu_busy_gpu_seconds

    v = cpu_busy_gpu_seconds(MINI, CostModel("h200-mini"), "cuda", reps=3, warmup=1)
    assert math.isfinite(v) and 0 <= v < 0.05


def test_the_contention_probe_times_a_cpu_call_and_copies_beside_each_other():
    """The profiler's ``copy_contention_slowdowns`` on the GPU: two finite slowdowns >= 0, a CPU call's compute timed
    beside copies that outlast it and copies timed beside a call that outlasts them (a shared host moves them by tens
    of percent, not several-fold)."""
    import math

    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.profiler.runtime_overhead import copy_contention_slowdowns

    v = copy_contention_slowdowns(MINI, CostModel("h200-mini"), "cuda", reps=3, warmup=1)
    assert set(v) == {"cpu_slowdown_beside_copies", "copies_slowdown_beside_cpu"}
    assert all(math.isfinite(x) and 0 <= x < 2 for x in v.values()), v


@pytest.mark.parametrize("model", ["olmoe-1b-7b", "qwen3-30b-a3b"])
def test_the_profiler_measures_a_catalogue_shape_other_than_llada2(tmp_path, model):
    """dllm-profile --model NAME on the GPU at another model's shape (no shared expert, plain top-k routing)."""
    from dllm_offload_sim.costmodel import CostModel
    from dllm_offload_sim.profiler.measure import measure_profile
    from dllm_offload_sim.traces.topology import topology_preset

    topo = topology_preset(model)
    prof = measure_profile(topo, device="cuda", quick=True, name=f"gpu-{model}", progress=lambda s: None)
    cm = CostModel(str(prof.save(tmp_path / f"gpu-{model}.measured.json")))
    assert cm.expert_bytes == topo.expert_bytes and cm.expert_h2d_seconds() > 0
    assert cm.gpu_experts_seconds(4, 4) > 0 and cm.profile.model_shape["n_experts"] == topo.n_experts
