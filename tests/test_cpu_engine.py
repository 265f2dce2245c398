"""CPU expert engines: the PyTorch reference and the native kt-kernel engine compute a layer's CPU experts as a
per-(token, expert) reference does, and the replay runs on either with the simulator's counters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_offload_sim.runtime.cpu_engine import (
    KtCpuEngine,
    TorchCpuEngine,
    kt_kernel_variant,
    make_cpu_engine,
)
from dllm_offload_sim.runtime.cpu_experts import cpu_expert_ffn
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.traces.topology import ModelTopology

needs_kt = pytest.mark.skipif(
    kt_kernel_variant() is None, reason="kt-kernel (with a BF16 MoE) is not installed"
)


def topology(n_moe: int = 2, n_experts: int = 16, top_k: int = 4, hidden: int = 256, inter: int = 128):
    return ModelTopology(
        name="engine-test",
        n_layers=n_moe + 1,
        moe_layers=tuple(range(1, n_moe + 1)),
        n_experts=n_experts,
        top_k=top_k,
        n_group=1,
        topk_group=1,
        hidden=hidden,
        moe_intermediate=inter,
        vocab_size=100,
        n_heads=2,
        n_kv_heads=1,
        head_dim=hidden // 2,
        dense_intermediate=hidden,
    )


def reference(x, ids, w, host: HostExperts, layer: int, experts) -> torch.Tensor:
    """fp32 sum over (token, slot) pairs routed to one of ``experts``, expert by expert in fp32."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e in experts:
                w13, w2 = host.expert(layer, e)
                out[t] += float(w[t, j]) * cpu_expert_ffn(x[t : t + 1].float(), w13.float(), w2.float())[0]
    return out


def routing(rng, T: int, topo: ModelTopology):
    ids = np.stack([rng.choice(topo.n_experts, topo.top_k, replace=False) for _ in range(T)]).astype(np.int64)
    return ids, rng.random((T, topo.top_k)).astype(np.float32)


def activations(rng, T: int, hidden: int) -> torch.Tensor:
    """A layer's ``T`` rows of activations (bf16) drawn from the test's seeded ``rng``."""
    return torch.from_numpy(rng.standard_normal((T, hidden)).astype(np.float32)).bfloat16()


def run_layer(engine, layer, x, ids, w, experts):
    out = torch.zeros((x.shape[0] + 1, x.shape[1]), dtype=torch.float32)  # the replay's layout: a scratch row
    times = engine.finish(engine.submit(layer, x, ids, w, experts), out)
    assert out[-1].abs().max() == 0  # nothing beyond the layer's rows
    return out[:-1], times


def test_the_reference_engine_sums_the_cpu_experts_of_a_layer():
    topo = topology()
    host = HostExperts(topo, n_real_layers=2, dtype=torch.bfloat16, pin=False, seed=1)
    rng = np.random.default_rng(0)
    eng = TorchCpuEngine(host, "cpu", threads=1)
    try:
        for layer, T in ((0, 5), (1, 3), (1, 5)):
            ids, w = routing(rng, T, topo)
            x = activations(rng, T, topo.hidden)
            experts = sorted(set(ids[:, 0].tolist()) | {int(ids[0, 1])})
            got, times = run_layer(eng, layer, x, ids, w, experts)
            ref = reference(x, ids, w, host, layer, set(experts))
            torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
            assert times.compute_s > 0 and times.start_delay_s >= 0 and times.wait_x_s >= 0
    finally:
        eng.close()


@needs_kt
@pytest.mark.parametrize("n_real,ordering", [(1, "host"), (2, "host"), (2, "direct")])
def test_the_native_engine_equals_the_reference_engine(n_real, ordering):
    """Several calls of different sizes, on every real layer, some tokens with no CPU expert at all: kt-kernel's
    result equals the reference engine's up to bf16 rounding of the layer's sum."""
    topo = topology(n_moe=3)
    host = HostExperts(topo, n_real_layers=n_real, dtype=torch.bfloat16, pin=False, seed=2)
    rng = np.random.default_rng(1)
    kt = KtCpuEngine(host, "cpu", threads=2, max_tokens=64, ordering=ordering)
    ref_eng = TorchCpuEngine(host, "cpu", threads=1)
    try:
        for layer, T in ((0, 1), (1, 7), (2, 7), (0, 33), (1, 2)):
            ids, w = routing(rng, T, topo)
            x = activations(rng, T, topo.hidden)
            experts = sorted(rng.choice(topo.n_experts, topo.n_experts // 2, replace=False).tolist())
            got, _ = run_layer(kt, layer, x, ids, w, experts)
            want, _ = run_layer(ref_eng, layer, x, ids, w, experts)
            scale = float(want.abs().max()) or 1.0
            assert float((got - want).abs().max()) <= 2**-6 * scale, (layer, T)
            idle = ~np.isin(ids, experts).any(1)  # tokens with no CPU expert get exactly nothing
            assert got[torch.from_numpy(idle)].abs().max().item() == 0 if idle.any() else True
    finally:
        kt.close()
        ref_eng.close()


@needs_kt
@pytest.mark.parametrize("hidden,inter", [(32, 32), (96, 96), (64, 128)])
def test_the_native_engine_holds_every_width_that_is_a_multiple_of_32(hidden, inter):
    """The widths the engine accepts (``kt_unsupported``) load and compute: small and odd multiples of 32 equal
    the reference engine up to bf16 rounding."""
    topo = topology(n_moe=1, hidden=hidden, inter=inter)
    host = HostExperts(topo, dtype=torch.bfloat16, pin=False, seed=3)
    rng = np.random.default_rng(4)
    kt, ref_eng = KtCpuEngine(host, "cpu", threads=2, max_tokens=16), TorchCpuEngine(host, "cpu", threads=1)
    try:
        ids, w = routing(rng, 6, topo)
        x = activations(rng, 6, hidden)
        got, _ = run_layer(kt, 0, x, ids, w, list(range(8)))
        want, _ = run_layer(ref_eng, 0, x, ids, w, list(range(8)))
        assert float((got - want).abs().max()) <= 2**-6 * (float(want.abs().max()) or 1.0)
    finally:
        kt.close()
        ref_eng.close()


@needs_kt
def test_loading_the_native_engine_keeps_ieee_floats():
    """kt-kernel's libraries switch on flush-to-zero when they load; the engine sets the mode back, so the rest
    of the process (policies, the simulator, hypothesis's float strategies) keeps subnormal floats."""
    from dllm_offload_sim.runtime.cpu_engine import subnormals_kept

    eng = KtCpuEngine(HostExperts(topology(n_moe=1), dtype=torch.bfloat16, pin=False), "cpu", threads=1)
    eng.close()
    assert subnormals_kept()


@needs_kt
def test_reserved_buffers_serve_the_calls_of_their_shape_and_results_stay_equal():
    """``reserve`` pins both buffer sets of each call size ahead of the calls (a replay's prepare, outside its timed
    forwards); calls of those shapes allocate nothing more, calls of another routing width get sets of their own,
    and the results equal the reference engine's as without reserving."""
    topo = topology(n_moe=1)
    host = HostExperts(topo, dtype=torch.bfloat16, pin=False, seed=3)
    rng = np.random.default_rng(4)
    kt = KtCpuEngine(host, "cpu", threads=1, max_tokens=16)
    ref_eng = TorchCpuEngine(host, "cpu", threads=1)
    try:
        kt.reserve(
            [3, 7, 99], topo.top_k, topo.hidden
        )  # 99 > max_tokens: no call can have it, nothing pinned
        assert sorted(kt._bufs) == [
            (3, topo.top_k, 0),
            (3, topo.top_k, 1),
            (7, topo.top_k, 0),
            (7, topo.top_k, 1),
        ]
        for T in (3, 7, 3, 7, 3):
            ids, w = routing(rng, T, topo)
            x = activations(rng, T, topo.hidden)
            experts = sorted(rng.choice(topo.n_experts, topo.n_experts // 2, replace=False).tolist())
            got, _ = run_layer(kt, 0, x, ids, w, experts)
            want, _ = run_layer(ref_eng, 0, x, ids, w, experts)
            assert float((got - want).abs().max()) <= 2**-6 * (float(want.abs().max()) or 1.0)
        assert len(kt._bufs) == 4
        ids, w = routing(rng, 3, topo)
        run_layer(
            kt, 0, activations(rng, 3, topo.hidden), ids[:, :1].copy(), w[:, :1].copy(), [int(ids[0, 0])]
        )
        assert (3, 1, 0) in kt._bufs and len(kt._bufs) == 5  # one routing slot: a set of its own
    finally:
        kt.close()
        ref_eng.close()


def test_a_cpu_results_add_takes_an_output_of_exactly_its_rows_as_it_is():
    """The native engine adds a call's result into the output's first rows: a caller that keeps that view (the
    replay) hands it over and no slice is made; a longer output is sliced."""
    from dllm_offload_sim.runtime.cpu_engine import _first_rows

    out = torch.zeros(5, 4)
    assert _first_rows(out, 5) is out
    v = _first_rows(out, 3)
    assert v.data_ptr() == out.data_ptr() and tuple(v.shape) == (3, 4)


@needs_kt
def test_the_native_engine_refuses_a_call_beyond_its_buffers():
    topo = topology(n_moe=1)
    host = HostExperts(topo, dtype=torch.bfloat16, pin=False)
    kt = KtCpuEngine(host, "cpu", threads=1, max_tokens=4)
    ids, w = routing(np.random.default_rng(0), 5, topo)
    with pytest.raises(ValueError, match=r"a call of 5 tokens exceeds max_tokens=4"):
        kt.submit(0, torch.zeros(5, topo.hidden).bfloat16(), ids, w, [0, 1])
    kt.close()


def test_engine_names_are_checked_and_auto_prefers_the_native_engine():
    topo = topology(n_moe=1)
    host = HostExperts(topo, dtype=torch.bfloat16, pin=False)
    with pytest.raises(ValueError, match=r"cpu_engine='numpy': expected one of auto, torch, kt"):
        make_cpu_engine("numpy", host, "cpu")
    eng = make_cpu_engine("auto", host, "cpu", threads=1)
    assert eng.name == ("kt" if kt_kernel_variant() else "torch")
    eng.close()


def test_widths_the_native_engine_cannot_hold_are_refused_and_auto_takes_the_reference():
    """kt-kernel's BF16 MoE crashes its loader on widths that are not multiples of 32 (a segfault, not an error):
    the engine refuses them before loading, naming the width, and ``auto`` runs the reference instead."""
    from dllm_offload_sim.runtime.cpu_engine import kt_unsupported

    assert kt_unsupported(topology(hidden=256, inter=64)) is None
    assert kt_unsupported(topology(hidden=64, inter=16)) == "moe_intermediate 16 not a multiple of 32"
    assert (
        kt_unsupported(topology(hidden=48, inter=48))
        == "hidden 48 and moe_intermediate 48 not a multiple of 32"
    )
    host = HostExperts(topology(n_moe=1, hidden=64, inter=16), dtype=torch.bfloat16, pin=False)
    eng = make_cpu_engine("auto", host, "cpu", threads=1)
    assert eng.name == "torch"
    eng.close()
    if kt_kernel_variant() is not None:
        with pytest.raises(ValueError, match=r"moe_intermediate 16 not a multiple of 32.*cpu_engine=torch"):
            make_cpu_engine("kt", host, "cpu", threads=1)


@pytest.mark.parametrize("engine", ["torch", pytest.param("kt", marks=needs_kt)])
def test_a_replay_on_either_engine_takes_the_simulators_decisions(tmp_path, engine):
    """OLED's replay (CPU experts every forward) on the engine named: counters equal the simulator's."""
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import COUNTERS, fidelity_rows
    from tests.simkit import flat_cost, random_request, write_requests

    topo = topology(n_moe=3, n_experts=16, top_k=4).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    path = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    rows, fwd, _ = fidelity_rows(
        Trace.open(path), OLEDPolicy, "oled", 6, flat_cost(topo), [0, 1], device="cpu", cpu_engine=engine
    )
    counters = {r["metric"]: r for r in rows if r["metric"] in COUNTERS}
    assert counters["cpu_experts"]["measured"] > 0 and {r["cpu_engine"] for r in rows} == {engine}
    assert all(r["predicted"] == r["measured"] for r in counters.values()), counters
    assert all(
        r["simulate_s"] > 0 and r["setup_s"] > 0 and r["replay_s"] > 0 for r in rows
    )  # where the run's time went


@needs_kt
def test_the_profiler_times_the_native_engine_and_a_profile_naming_it_replays_on_it(tmp_path):
    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.profiler.measure import Grids, measure_cpu_expert
    from dllm_offload_sim.runtime.cpu_engine import profiled_cpu_engine
    from tests.simkit import flat_profile

    topo = topology(n_moe=1)
    host = HostExperts(topo, dtype=torch.bfloat16, pin=False)
    gr = Grids(quick=True)
    # calls of 16+ tokens per expert: their compute (~6 ms per expert on a 2-core CI host) dwarfs the ~10 ms that
    # kt-kernel's spinning threads can cost a small call there, which would make a 1-token curve fail its check
    gr.tokens, gr.cpu_bands = [16, 32], ()  # no larger calls: the bands' logic has a test of its own
    eng = KtCpuEngine(host, "cpu", threads=2, max_tokens=max(gr.tokens) * 8)
    try:
        c = measure_cpu_expert(topo, eng, gr)
        per_expert, overhead, threads = c.per_expert_s, c.call_overhead_s, c.threads
    finally:
        eng.close()
    assert len(per_expert) == len(gr.tokens) and min(per_expert) >= 0 and overhead >= 0 and threads == 2
    assert per_expert[-1] + overhead > 0

    prof = flat_profile(topo)
    prof.curves["cpu_expert"].update(engine="kt", threads=2)
    assert (
        CostModel(prof.save(tmp_path / "kt.json")).cpu_ordering == "stream"
    )  # what profiles before the field measured
    prof.curves["cpu_expert"].update(ordering="direct")
    cm = CostModel(prof.save(tmp_path / "kt.json"))
    assert cm.cpu_engine == "kt" and cm.cpu_expert_threads == 2 and cm.cpu_ordering == "direct"
    eng = profiled_cpu_engine(cm, host, "cpu")
    assert eng.name == "kt" and eng.threads == 2 and eng.ordering == "direct"
    eng.close()


@needs_kt
def test_the_native_engine_checks_its_ordering():
    host = HostExperts(topology(n_moe=1), dtype=torch.bfloat16, pin=False)
    with pytest.raises(ValueError, match=r"ordering='gpu': expected one of host, stream, direct"):
        KtCpuEngine(host, "cpu", threads=1, ordering="gpu")


def test_a_profile_naming_an_unknown_engine_is_refused(tmp_path):
    import json

    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.costmodel.profile import ProfileError
    from tests.simkit import flat_profile

    path = flat_profile(topology(n_moe=1)).save(tmp_path / "p.json")
    d = json.loads(path.read_text())
    d["cpu_expert"]["engine"] = "numpy"
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"cpu_expert\.engine.*must be one of torch, kt, got 'numpy'"):
        CostModel(str(path))
    d["cpu_expert"].update(engine="kt", ordering="later")
    path.write_text(json.dumps(d))
    with pytest.raises(
        ProfileError, match=r"cpu_expert\.ordering.*must be one of host, stream, direct, got 'later'"
    ):
        CostModel(str(path))


@pytest.mark.gpu
@needs_kt
@pytest.mark.parametrize("ordering", ["host", "stream", "direct"])
def test_on_the_gpu_the_native_engine_equals_the_reference(ordering):
    """Mini shapes, activations and results on the GPU, expert copies queued on the copy stream meanwhile: the
    native engine's result equals the reference engine's in either ordering; stream-ordered, the host only
    enqueues (its submit and finish take a fraction of the call's time on the stream)."""
    import time

    from dllm_offload_sim.runtime.copy_engine import ExpertCopier
    from dllm_offload_sim.runtime.slot_pool import SlotPool
    from dllm_offload_sim.traces.topology import MINI

    host = HostExperts(MINI, n_real_layers=1)
    pool = SlotPool(8, MINI.hidden, MINI.moe_intermediate, device="cuda")
    copier = ExpertCopier(host, pool, "cuda")
    rng = np.random.default_rng(0)
    kt, ref_eng = KtCpuEngine(host, "cuda", max_tokens=1024, ordering=ordering), TorchCpuEngine(host, "cuda")
    try:
        for n, tpe in ((16, 1), (60, 16)):
            T = n * tpe
            experts = rng.choice(MINI.n_experts, n, replace=False)
            ids = np.concatenate(
                [experts[np.arange(T) // tpe, None], rng.integers(0, MINI.n_experts, (T, MINI.top_k - 1))], 1
            ).astype(np.int64)
            w = rng.random(ids.shape).astype(np.float32)
            x = torch.randn((T, MINI.hidden), dtype=torch.bfloat16, device="cuda")
            outs = {}
            for eng in (kt, ref_eng):
                out = torch.zeros((T, MINI.hidden), dtype=torch.float32, device="cuda")
                torch.cuda.synchronize()
                copier.demand(0, list(range(8)), [pool.assign(0, e) for e in range(8)])  # 50 MB queued
                t0 = time.perf_counter()
                eng.finish(eng.submit(0, x, ids, w, experts.tolist()), out)
                t_host = time.perf_counter() - t0
                torch.cuda.synchronize()
                t_all = time.perf_counter() - t0
                outs[eng.name] = out.cpu()
                if eng is kt and n == 60 and ordering == "stream":
                    assert t_host < 0.5 * t_all, (t_host, t_all)
            scale = float(outs["torch"].abs().max())
            assert float((outs["kt"] - outs["torch"]).abs().max()) <= 2**-6 * scale
    finally:
        kt.close()
        ref_eng.close()


@pytest.mark.gpu
@needs_kt
@pytest.mark.parametrize("ordering", ["host", "stream"])
def test_on_the_gpu_a_call_follows_the_current_stream_its_caller_passes(ordering):
    """Activations computed on a side stream, behind a long chain of matmuls, and the call made with that stream
    current and passed (``current=``, as the replay passes its stream): the call reads them only once computed and
    adds its result on that stream, so its output equals the reference engine's."""
    from dllm_offload_sim.traces.topology import MINI

    host = HostExperts(MINI, n_real_layers=1)
    rng = np.random.default_rng(1)
    kt, ref_eng = KtCpuEngine(host, "cuda", max_tokens=64, ordering=ordering), TorchCpuEngine(host, "cuda")
    side = torch.cuda.Stream()
    a = torch.randn((4096, 4096), dtype=torch.bfloat16, device="cuda")
    try:
        T = 32
        ids = np.stack([rng.choice(MINI.n_experts, MINI.top_k, replace=False) for _ in range(T)]).astype(
            np.int64
        )
        w = rng.random(ids.shape).astype(np.float32)
        experts = sorted(set(ids[:, 0].tolist()))
        x0 = torch.randn((T, MINI.hidden), dtype=torch.bfloat16, device="cuda")
        outs = {}
        for eng in (kt, ref_eng):
            out = torch.zeros((T + 1, MINI.hidden), dtype=torch.float32, device="cuda")
            x = torch.zeros_like(x0)
            torch.cuda.synchronize()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                b = a
                for _ in range(30):  # milliseconds of GPU work ahead of the activations
                    b = b @ a
                x.copy_(torch.where(b[:T, : MINI.hidden].isfinite(), x0, x0))  # x0, once b is computed
                eng.finish(eng.submit(0, x, ids, w, experts, current=side), out, current=side)
            side.synchronize()
            outs[eng.name] = out.cpu()
        scale = float(outs["torch"].abs().max())
        assert scale > 0 and float((outs["kt"] - outs["torch"]).abs().max()) <= 2**-6 * scale
    finally:
        kt.close()
        ref_eng.close()


@pytest.mark.gpu
@needs_kt
@pytest.mark.parametrize("name", ["ktransformers", "oled"])
def test_on_the_gpu_a_replay_on_the_native_engine_keeps_the_simulators_counters(tmp_path, name):
    from dllm_offload_sim.policies.ktransformers import KTransformersPolicy
    from dllm_offload_sim.policies.oled import OLEDPolicy
    from dllm_offload_sim.traces.reader import Trace
    from dllm_offload_sim.validate.fidelity import COUNTERS, fidelity_rows
    from tests.simkit import flat_cost, random_request, write_requests

    make = {"ktransformers": KTransformersPolicy, "oled": OLEDPolicy}[name]
    topo = topology(n_moe=3, n_experts=16, top_k=4).with_widths(n_group=2, topk_group=1)
    rng = np.random.default_rng(0)
    path = write_requests(tmp_path / "t", topo, [random_request(rng, r, topo, 9, 3) for r in (0, 1)])
    rows, _, lay = fidelity_rows(
        Trace.open(path),
        make,
        name,
        6,
        flat_cost(topo),
        [0, 1],
        device="cuda",
        cpu_engine="kt",
        record_layers=True,
    )
    counters = {r["metric"]: r for r in rows if r["metric"] in COUNTERS}
    assert counters["cpu_experts"]["measured"] > 0
    assert all(r["predicted"] == r["measured"] for r in counters.values()), counters
    # the per-layer timeline on the GPU's clock: each layer's CPU path starts after its routing is computed and
    # ends before its output is complete
    eps = 1e-6
    assert (
        lay.measured_gpu_gate_s.notna().all()
        and (lay.measured_gpu_end_s >= lay.measured_gpu_gate_s - eps).all()
    )
    c = lay[lay.predicted_to_cpu > 0]
    assert len(c) and c.measured_cpu_start_s.notna().all()
    assert (c.measured_cpu_start_s >= c.measured_gpu_gate_s - eps).all()
    assert (c.measured_cpu_end_s >= c.measured_cpu_start_s).all()
    assert (c.measured_gpu_end_s >= c.measured_cpu_end_s - eps).all()
    # its parts: the task computed inside the path (before the result's copy); copies landed before the output is
    assert c.measured_cpu_computed_s.notna().all()
    assert (
        (c.measured_cpu_computed_s >= c.measured_cpu_start_s)
        & (c.measured_cpu_computed_s <= c.measured_cpu_end_s)
    ).all()
    g = lay[lay.predicted_to_gpu > 0]
    assert (
        g.measured_copies_end_s.notna().all()
        and (g.measured_gpu_end_s >= g.measured_copies_end_s - eps).all()
    )
    assert lay[lay.predicted_to_gpu == 0].measured_copies_end_s.isna().all()


class _Clock:
    """Stands in for the ``time`` module of ``runtime.timing``: sleeping moves it on, and so does a test engine's
    call, so the profiler's timings of those engines are exact (no sleep jitter on a busy machine)."""

    def __init__(self):
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock(monkeypatch):
    import dllm_offload_sim.runtime.timing as timing

    c = _Clock()
    monkeypatch.setattr(timing, "time", c)
    return c


class _StallingEngine:
    """A CPU engine that stalls its 1-expert calls from ``stall_from_tokens`` tokens per expert (2 ms, while a call
    over more experts takes 0.05 ms per expert); below that, 0.2 ms per expert. Its calls take their time on
    ``clock``."""

    name, threads, device = "torch", 1, torch.device("cpu")

    def __init__(self, stall_from_tokens: int, clock: _Clock):
        self.stall_from, self.clock, self.calls = stall_from_tokens, clock, 0

    def submit(self, layer, x, ids, weights, experts):
        self.calls += 1
        tokens = x.shape[0] // len(experts)
        if tokens >= self.stall_from:
            self.clock.sleep(2e-3 if len(experts) == 1 else 5e-5 * len(experts))
        else:
            self.clock.sleep(2e-4 * len(experts))
        return None

    def finish(self, handle, out):
        return None


def test_a_cpu_curve_where_more_experts_cost_no_more_is_measured_again_then_refused(clock):
    """An engine that stalls calls of some sizes would give a CPU curve with zero cost per expert there (and
    predict its CPU paths wrongly): the profiler measures those points again, then refuses, naming them."""
    from dllm_offload_sim.profiler.measure import (
        CpuCurveError,
        Grids,
        cpu_call_experts,
        cpu_engine_max_tokens,
        measure_cpu_expert,
    )

    gr = Grids(quick=True)
    gr.reps, gr.warmup, gr.passes = 1, 0, 1
    steps = []
    with pytest.raises(CpuCurveError, match=r"after 3 measurements.*4 tokens: 1 expert [\d.]+ ms, 8 experts"):
        measure_cpu_expert(topology(n_moe=1), _StallingEngine(4, clock), gr, progress=steps.append)
    assert (
        steps
        == ["cpu_expert again at tokens [4, 16] (a call over more experts was no slower than over one)"] * 2
    )
    c = measure_cpu_expert(topology(n_moe=1), _StallingEngine(10**6, clock), gr)
    assert c.per_expert_s == pytest.approx([2e-4] * len(gr.tokens)) and c.call_overhead_s == pytest.approx(
        0.0, abs=1e-12
    )
    assert c.one_expert_s == pytest.approx([2e-4] * len(gr.tokens)) and c.many_experts == [8] * len(gr.tokens)
    # experts too cheap to time apart on a busy host (every call the same fast 0.1 ms) are noise, not a stall
    flat = _StallingEngine(0, clock)
    flat.submit = lambda layer, x, ids, w, experts: clock.sleep(1e-4)
    c = measure_cpu_expert(topology(n_moe=1), flat, gr)
    assert c.per_expert_s == [0.0] * len(gr.tokens) and c.call_overhead_s == pytest.approx(1e-4)
    assert (
        cpu_call_experts(1) == 8
        and cpu_call_experts(1024) == 2
        and cpu_engine_max_tokens([1, 16, 1024]) == 2048
    )


def test_a_parallel_engine_whose_one_expert_calls_cost_as_much_as_eight_is_no_stall(clock):
    """A parallel engine runs a call's experts side by side, so at many tokens a 1-expert call costs about what a
    call over 8 does (kt-kernel on the H200 host: 1.97 against 1.78 ms at 64 tokens). That is no stall. The call's
    fixed cost comes from the decode-sized points only, and at those points an expert costs the 8-expert call's
    average beyond that fixed cost (not the slope from 1 to 8 experts, which is nothing there)."""
    from dllm_offload_sim.profiler.cpu_fit import CPU_OVERHEAD_MAX_TOKENS
    from dllm_offload_sim.profiler.measure import Grids, measure_cpu_expert

    gr = Grids(quick=True)
    gr.reps, gr.warmup, gr.passes = 1, 0, 1
    gr.tokens = [1, 4, 16, 64, 128]
    eng = _StallingEngine(10**6, clock)

    def parallel(layer, x, ids, w, experts):  # 0.5 ms a call, + 0.1 ms per expert; from 64 tokens 2 ms a call
        tokens = x.shape[0] // len(experts)
        clock.sleep(2e-3 - 1e-5 * len(experts) if tokens >= 64 else 5e-4 + 1e-4 * len(experts))

    eng.submit = parallel
    c = measure_cpu_expert(topology(n_moe=1), eng, gr)
    per_8 = (
        2e-3 - 8e-5 - 5e-4
    ) / 8  # the 8-expert call (2 ms - 8 x 0.01 ms) beyond the 0.5 ms fixed cost, per expert
    assert c.per_expert_s == pytest.approx([1e-4, 1e-4, 1e-4, per_8, per_8])
    assert CPU_OVERHEAD_MAX_TOKENS == 16 and c.call_overhead_s == pytest.approx(5e-4)  # not the 2 ms calls'


def test_the_profiler_measures_what_each_expert_beyond_eight_costs_in_a_larger_call(clock):
    """A parallel engine runs a large call's experts side by side, so past the first few each costs less: the profiler
    times larger calls too and records the slope beyond the 8-expert call as a band (``cpu_expert.bands``), capped
    where a call would pass the largest timed call, and the cost model charges a call's later experts at it."""
    from dllm_offload_sim.profiler.measure import (
        CPU_CALL_MAX_TOKENS,
        Grids,
        cpu_engine_max_tokens,
        measure_cpu_expert,
    )

    gr = Grids(quick=True)
    gr.reps, gr.warmup, gr.passes = 1, 0, 1
    gr.tokens, gr.cpu_bands = [1, 16, CPU_CALL_MAX_TOKENS // 8], (12, 40)
    eng = _StallingEngine(10**6, clock)

    def parallel(
        layer, x, ids, w, experts
    ):  # 0.5 ms, 0.1 ms for each of the first 8 experts, then 25 us, then 10 us
        n = len(experts)
        clock.sleep(5e-4 + 1e-4 * min(n, 8) + 2.5e-5 * max(min(n, 12) - 8, 0) + 1e-5 * max(n - 12, 0))

    eng.submit = parallel
    c = measure_cpu_expert(topology(n_moe=1, n_experts=64), eng, gr)
    assert c.per_expert_s == pytest.approx([1e-4] * 3) and c.call_overhead_s == pytest.approx(5e-4)
    assert [b["after"] for b in c.bands] == [8, 12]
    # at 256 tokens a call cannot grow past 8 experts (2048 tokens): its bands keep the cost of the experts before
    assert c.bands[0]["seconds"] == pytest.approx([2.5e-5, 2.5e-5, 1e-4])
    assert c.bands[1]["seconds"] == pytest.approx([1e-5, 1e-5, 1e-4])
    assert c.band_experts == [[12, 12, 8], [40, 40, 8]]
    # no call larger than the model has experts: with 16, the second band's calls stop at 16
    assert measure_cpu_expert(topology(n_moe=1), eng, gr).band_experts == [[12, 12, 8], [16, 16, 8]]
    assert cpu_engine_max_tokens(gr.tokens, gr.cpu_bands) == CPU_CALL_MAX_TOKENS  # sized for the largest call
    assert (
        cpu_engine_max_tokens([1, 16], gr.cpu_bands) == 16 * 40 and cpu_engine_max_tokens([1, 16]) == 16 * 8
    )


class _FixedCostEngine(_StallingEngine):
    """A CPU engine whose call takes a fixed 3 ms plus 0.2 ms per expert, and which records where its activations
    were handed to it."""

    def __init__(self, clock: _Clock):
        super().__init__(10**6, clock)
        self.devices = set()

    def submit(self, layer, x, ids, weights, experts):
        self.devices.add(x.device)
        self.clock.sleep(3e-3 + 2e-4 * len(experts))


def test_the_cpu_call_overhead_leaves_out_the_activations_round_trip_the_cost_model_charges_apart(clock):
    """The profiler hands the engine its activations where the replay has them (the engine's device), so a call
    includes their round trip; ``dispatch`` (that trip, measured apart) comes out of the call's fixed cost."""
    from dllm_offload_sim.profiler.measure import Grids, measure_cpu_expert

    gr = Grids(quick=True)
    gr.reps, gr.warmup, gr.passes = 3, 1, 1
    eng = _FixedCostEngine(clock)
    alone = measure_cpu_expert(topology(n_moe=1), eng, gr).call_overhead_s
    c = measure_cpu_expert(topology(n_moe=1), eng, gr, dispatch=[2e-3] * len(gr.tokens))
    per_expert, less = c.per_expert_s, c.call_overhead_s
    assert eng.devices == {eng.device}
    assert alone == pytest.approx(3e-3) and less == pytest.approx(1e-3)
    assert per_expert == pytest.approx([2e-4] * len(gr.tokens))


def test_the_cpu_curve_fit_keeps_the_slope_at_decode_sizes_and_the_many_expert_average_past_them():
    """The fit of the shipped H200 profile's calls: at 1-16 tokens an expert costs the slope from the 1- to the
    8-expert call; at 32-128 tokens, where kt-kernel's 1-expert calls were as slow as its 8-expert ones (a slope of
    nothing), it costs the 8-expert call's average beyond the fixed cost and the round trip of its rows; at 256+
    tokens, where the slope is larger again, the larger of the two."""
    from dllm_offload_sim.profiler.cpu_fit import cpu_expert_fit

    tokens = [1, 16, 32, 64, 1024]
    one = [0.40e-3, 0.90e-3, 1.43e-3, 2.50e-3, 5.70e-3]
    many = [0.90e-3, 2.02e-3, 1.43e-3, 2.09e-3, 6.81e-3]
    many_n = [8, 8, 8, 8, 2]
    dispatch = [0.04e-3, 0.05e-3, 0.06e-3, 0.08e-3, 0.55e-3]  # the round trip at 1 .. 1024 rows
    per, overhead = cpu_expert_fit(tokens, one, many, many_n, dispatch)
    slope1, slope16 = (0.90e-3 - 0.40e-3) / 7, (2.02e-3 - 0.90e-3) / 7
    assert overhead == pytest.approx(np.median([0.40e-3 - slope1 - 0.04e-3, 0.90e-3 - slope16 - 0.05e-3]))
    assert per[:2] == pytest.approx([slope1, slope16])
    trip_256, trip_512 = (
        0.08e-3 + (256 - 64) * (0.55e-3 - 0.08e-3) / 960,
        0.08e-3 + (512 - 64) * (0.55e-3 - 0.08e-3) / 960,
    )
    assert per[2] == pytest.approx((1.43e-3 - overhead - trip_256) / 8)
    assert per[3] == pytest.approx((2.09e-3 - overhead - trip_512) / 8)
    trip_2048 = 0.55e-3 + (2048 - 1024) * (0.55e-3 - 0.08e-3) / 960  # extrapolated past the last point
    assert per[4] == pytest.approx(max(6.81e-3 - 5.70e-3, (6.81e-3 - overhead - trip_2048) / 2))
    assert cpu_expert_fit([1, 2], [1e-4, 2e-4], [8e-4, 9e-4], [8, 8])[1] >= 0  # without a round trip
