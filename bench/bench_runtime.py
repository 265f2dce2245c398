"""Runtime primitives on the GPU host (targets from the runtime/profiler issue).

    python bench/bench_runtime.py [--model mini] [--json out.json]

1. Demand H2D of experts through the runtime's copier vs a plain pinned copy of the same bytes
   (target >= 90%).
2. Grouped GPU compute of 60 experts x 16 tokens vs 60 separately launched FFNs (target >= 10x
   faster) and vs the dense-GEMM lower bound: the same FLOPs and weight bytes as two dense GEMMs
   over the 60 experts' concatenated weights (target within 2x).
3. CPU expert time vs the time to stream its weights at the host's measured memory bandwidth
   (target within 2x).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from dllm_offload_sim.runtime.timing import median_seconds
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.runtime.copy_engine import ExpertCopier
from dllm_offload_sim.runtime.cpu_experts import cpu_expert_ffn
from dllm_offload_sim.runtime.grouped import grouped_ffn, plan_from_numpy
from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.slot_pool import SlotPool
from dllm_offload_sim.traces.cli import HelpFormatter


def bench(model: str = "mini", n_act: int = 60, tok: int = 16) -> dict:
    topo = topology_preset(model)
    H, I = topo.hidden, topo.moe_intermediate
    dev = "cuda"
    host = HostExperts(topo, n_real_layers=1)
    pool = SlotPool(topo.n_experts, H, I, device=dev)
    cp = ExpertCopier(host, pool, dev)
    slots = [pool.assign(1, e) for e in range(n_act)]
    r = {"model": topo.name, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    # 1. demand copies vs plain pinned copies of the same bytes
    def demand():
        cp.demand(1, list(range(n_act)), slots)

    t_demand = median_seconds(demand, dev, reps=10, stream=cp.stream)
    nbytes = n_act * host.expert_bytes
    src = torch.empty(host.expert_bytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty((n_act, host.expert_bytes), dtype=torch.uint8, device=dev)
    st = torch.cuda.Stream()

    def plain():
        with torch.cuda.stream(st):
            for i in range(n_act):
                dst[i].copy_(src, non_blocking=True)

    t_plain = median_seconds(plain, dev, reps=10, stream=st)
    r["h2d_demand_gbps"] = nbytes / t_demand / 1e9
    r["h2d_plain_gbps"] = nbytes / t_plain / 1e9
    r["h2d_ratio"] = t_plain / t_demand

    # 2. grouped compute vs per-expert launches vs dense lower bound
    torch.cuda.synchronize()
    x = torch.randn(n_act * tok, H, device=dev, dtype=torch.bfloat16)
    ids = (np.arange(n_act * tok) // tok).reshape(-1, 1)
    plan = plan_from_numpy(
        ids, np.ones(ids.shape, np.float32), pool.slot_lut(1, topo.n_experts).numpy(), topo.n_experts, dev
    )  # built once: the grouped call itself is timed
    t_group = median_seconds(lambda: grouped_ffn(x, pool.w13, pool.w2, plan), dev)
    t_loop = median_seconds(lambda: grouped_ffn(x, pool.w13, pool.w2, plan, backend="loop"), dev)
    t_bmm = median_seconds(lambda: grouped_ffn(x, pool.w13, pool.w2, plan, backend="bmm"), dev)
    w13c = pool.w13[:n_act].reshape(n_act * 2 * I, H)
    w2c = pool.w2[:n_act].transpose(0, 1).reshape(H, n_act * I)
    xt = x[:tok]

    def dense():
        h = xt @ w13c.t()  # [tok, n*2I]: each token through every expert = the same FLOPs and bytes
        h = h.view(tok, n_act, 2 * I)
        a = (F.silu(h[..., :I]) * h[..., I:]).reshape(tok, n_act * I)
        return a @ w2c.t()

    t_dense = median_seconds(dense, dev)
    r.update(
        grouped_s=t_group,
        loop_s=t_loop,
        bmm_s=t_bmm,
        dense_bound_s=t_dense,
        grouped_speedup_vs_loop=t_loop / t_group,
        grouped_vs_dense=t_group / t_dense,
        grouped_backend="grouped_mm" if hasattr(torch, "_grouped_mm") else "bmm",
    )

    # 3. CPU expert vs streaming its weights at the host's memory bandwidth
    a = torch.ones(1 << 30, dtype=torch.uint8)
    b = torch.empty_like(a)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    host_bw = 2 * a.numel() / min(ts)  # bytes read + written per second
    r["host_mem_gbps"] = host_bw / 1e9
    for n in (1, 16):
        xc = torch.randn(n, H, dtype=torch.bfloat16)
        nxt = iter(range(10**9))  # a different expert each call: weights come from DRAM, not the cache
        t_cpu = median_seconds(
            lambda: cpu_expert_ffn(xc, *host.expert(1, next(nxt) % topo.n_experts)), "cpu", reps=30
        )
        bound = host.expert_bytes / host_bw
        r[f"cpu_expert_{n}tok_s"] = t_cpu
        r[f"cpu_vs_stream_bound_{n}tok"] = t_cpu / bound
    r["cpu_stream_bound_s"] = host.expert_bytes / host_bw
    r["cpu_threads"] = torch.get_num_threads()
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_runtime.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--model", default="mini")
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    r = bench(args.model)
    print(f"[{r['model']} on {r['gpu']}, torch {r['torch']}]")
    print(
        f"H2D demand copies {r['h2d_demand_gbps']:.1f} GB/s vs plain pinned {r['h2d_plain_gbps']:.1f} GB/s "
        f"-> {100 * r['h2d_ratio']:.0f}% [target >= 90%]"
    )
    print(
        f"grouped ({r['grouped_backend']}) 60x16: {r['grouped_s'] * 1e6:.0f} us; 60 launches {r['loop_s'] * 1e6:.0f} us "
        f"({r['grouped_speedup_vs_loop']:.1f}x) [target >= 10x]; dense bound {r['dense_bound_s'] * 1e6:.0f} us "
        f"({r['grouped_vs_dense']:.2f}x) [target <= 2x]; bmm backend {r['bmm_s'] * 1e6:.0f} us"
    )
    for n in (1, 16):
        print(
            f"CPU expert {n} tok: {r[f'cpu_expert_{n}tok_s'] * 1e6:.0f} us = {r[f'cpu_vs_stream_bound_{n}tok']:.2f}x "
            f"the {r['cpu_stream_bound_s'] * 1e6:.0f} us weight-streaming bound at {r['host_mem_gbps']:.0f} GB/s "
            f"[target <= 2x] ({r['cpu_threads']} threads)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
