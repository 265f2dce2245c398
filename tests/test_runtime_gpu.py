"""Runtime primitives on a CUDA GPU (run on the device; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from traces.topology import MINI
from validate.copy_engine import ExpertCopier
from validate.grouped import grouped_ffn, routing_plan
from validate.host_experts import HostExperts
from validate.slot_pool import SlotPool

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
