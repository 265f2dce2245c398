"""Estimated profiles for machines we cannot measure here.

``dllm-profile-estimate`` rewrites ``costmodel/profiles/*.estimated.json``: the paper's two testbeds carried over
from the measured H100 profiles by their published specifications (:mod:`costmodel.testbed`, each assumption with
its source and range), and a first H200 estimate as a roofline from the parameters below: a launch/synchronisation
floor plus bytes over an effective bandwidth (or FLOPs over an effective throughput, whichever is larger). Sources:

* H200 host (measured on the lent machine): pinned H2D 54 GB/s at
  6 MiB (117 us per mini expert), 55 GB/s at 24 MiB (458 us per flash expert); one mini expert FFN
  launched alone ~50 us; CPU mini expert fp32 95-170 us for 1-16 tokens on 16 threads.
* H200 HBM3e 4.8 TB/s peak (we assume 3.3 TB/s effective), ~790 TFLOP/s bf16 dense (device notes;
  we assume 400 effective for small grouped GEMMs).

All of these are *estimates*: the profiler (``dllm-profile`` on a GPU host) replaces them
with measured files, which the simulator prefers when both exist.
"""

from __future__ import annotations

import argparse
import sys

from dllm_offload_sim.costmodel.profile import PROFILE_DIR, HardwareProfile
from dllm_offload_sim.costmodel.testbed import paper_testbeds, estimate_testbed
from dllm_offload_sim.traces.catalogue import find_model
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.topology import MINI, ModelTopology, topology_preset
from dllm_offload_sim.traces.cli import entry_point

MIB = 1 << 20
H2D_BYTES = [1 * MIB, 2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB, 16 * MIB, 24 * MIB, 32 * MIB, 64 * MIB]
EXPERTS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TOKENS_PER_EXPERT = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
KV = [0, 256, 1024, 4096, 16384]

MACHINES = {
    "h200": dict(
        gpu="NVIDIA H200 (estimated)",
        hbm_Bps=3.3e12,
        flops=400e12,
        h2d_latency_s=5e-6,
        h2d_Bps=56e9,
        grouped_launch_s=30e-6,
        layer_launch_s=75e-6,
        forward_launch_s=40e-6,
        sync_s=15e-6,
        cpu_fixed_s=90e-6,
        cpu_per_token_s=5e-6,
        cpu_model="16-core host CPU with AMX (estimated)",
        cpu_threads=16,
    ),
}
TARGETS = [
    ("h200", "mini"),
    ("h200", "flash"),
]  # the shipped roofline estimates (machine, catalogue model); the testbeds come from costmodel.testbed


def estimate_profile(machine: str, topo: ModelTopology, key: str | None = None) -> HardwareProfile:
    """A roofline estimate of every curve for ``machine`` at the model shape ``topo``, named ``<machine>-<key>``
    (``key``: the model's catalogue name, ``mini`` for LLaDA2.0-mini; default the last part of the topology's
    name). Assumptions beyond the machine's parameters: a CPU expert costs what the mini one does (the parameters
    ``cpu_fixed_s`` and ``cpu_per_token_s``), scaled by the expert's bytes, which it streams from host memory."""
    m = MACHINES[machine]
    eb = topo.expert_bytes
    scale = eb / MINI.expert_bytes  # CPU expert cost scales with the weights it streams
    sizes = list(H2D_BYTES)
    while sizes[-1] < 2 * eb:  # the copy curve reaches past an expert of any size (Mixtral's is 336 MiB)
        sizes.append(2 * sizes[-1])
    h2d = {"bytes": sizes, "seconds": [m["h2d_latency_s"] + b / m["h2d_Bps"] for b in sizes]}

    def expert_s(t):  # one expert on the GPU inside a grouped call: weights streamed or FLOP bound
        return max(eb / m["hbm_Bps"], t * topo.expert_flops_per_token / m["flops"])

    gpu = [[m["grouped_launch_s"] + n * expert_s(t) for t in TOKENS_PER_EXPERT] for n in EXPERTS]
    cpu = [scale * (m["cpu_fixed_s"] + t * m["cpu_per_token_s"]) for t in TOKENS]
    act_bytes = 2 * topo.hidden * 2  # bf16 activations out and results back, per token
    dispatch = [2 * m["sync_s"] + t * act_bytes / m["h2d_Bps"] for t in TOKENS]
    dt = 2  # bf16 bytes
    attn_bytes = (
        dt * topo.hidden * (topo.n_heads + 2 * topo.n_kv_heads) * topo.head_dim
        + dt * topo.n_heads * topo.head_dim * topo.hidden
    )
    attn_flops_tok = 2 * attn_bytes / dt
    kv_bytes = 2 * topo.n_kv_heads * topo.head_dim * dt

    def layer_s(t, kv, mlp_bytes):
        mem = (attn_bytes + mlp_bytes + topo.n_experts * topo.hidden * dt + (kv + t) * kv_bytes) / m[
            "hbm_Bps"
        ]
        comp = (
            t * (attn_flops_tok + 2 * mlp_bytes / dt) / m["flops"]
            + 4 * t * (kv + t) * topo.n_heads * topo.head_dim / m["flops"]
        )
        return m["layer_launch_s"] + max(mem, comp)

    ne = [[layer_s(t, kv, eb * topo.n_shared_experts) for kv in KV] for t in TOKENS]
    dense = [[layer_s(t, kv, 3 * topo.hidden * topo.dense_intermediate * dt) for kv in KV] for t in TOKENS]
    lm = topo.vocab_size * topo.hidden * dt
    fwd = [m["forward_launch_s"] + (lm + t * topo.vocab_size * 4) / m["hbm_Bps"] for t in TOKENS]
    return HardwareProfile(
        name=f"{machine}-{key or topo.name.split('-')[-1]}",
        status="estimated",
        stamp={
            "gpu": m["gpu"],
            "driver": "n/a (estimated)",
            "cuda": "n/a (estimated)",
            "torch": "n/a (estimated)",
            "cpu_model": m["cpu_model"],
            "cpu_threads": m["cpu_threads"],
            "dtype": topo.dtype,
        },
        model_shape={
            "name": topo.name,
            "hidden": topo.hidden,
            "moe_intermediate": topo.moe_intermediate,
            "expert_bytes": eb,
            "n_moe_layers": topo.n_moe_layers,
            "n_experts": topo.n_experts,
        },
        h2d=h2d,
        curves={
            "gpu_experts": {"experts": EXPERTS, "tokens_per_expert": TOKENS_PER_EXPERT, "seconds": gpu},
            "cpu_expert": {"tokens": TOKENS, "seconds": cpu, "threads": m["cpu_threads"]},
            "cpu_dispatch": {"tokens": TOKENS, "seconds": dispatch},
            "non_expert": {"tokens": TOKENS, "kv_len": KV, "seconds": ne},
            "dense_layer": {"tokens": TOKENS, "kv_len": KV, "seconds": dense},
            "per_forward": {"tokens": TOKENS, "seconds": fwd},
        },
        notes=f"Roofline estimate from dllm_offload_sim/costmodel/estimate.py (machine '{machine}'); see that module's docstring "
        f"for sources. Replace with a measured profile from `dllm-profile`.",
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-profile-estimate",
        description="Estimate profiles: without --model, rewrite the shipped estimated profiles "
        "(costmodel/profiles/*.estimated.json); with --model, a roofline estimate of any catalogue model (or model "
        "file) on --machine, written to --out as <machine>-<model>.estimated.json.",
        epilog="Example: dllm-profile-estimate --model olmoe-1b-7b --machine h200 --out .   then   dllm-sim "
        "model=olmoe-1b-7b trace.path=T hw=h200 hw.profile=h200-olmoe-1b-7b.estimated.json",
    )
    p.add_argument("--model", default=None, help="a catalogue model or model file (docs/models.md)")
    p.add_argument("--machine", default="h200", choices=sorted(MACHINES), help="the machine's parameters")
    p.add_argument(
        "--out", default=None, help="folder to write into (default: the shipped profiles; with --model, here)"
    )
    args = p.parse_args(argv)
    if args.model is not None:
        try:
            model = find_model(args.model)
        except TraceError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        prof = estimate_profile(args.machine, model.topology, key=model.path.stem)
        path = prof.save(f"{args.out or '.'}/{prof.name}.estimated.json")
        print(f"wrote {path} (a roofline estimate: replace it with dllm-profile's measurement where you can)")
        return 0
    args.out = args.out or str(PROFILE_DIR)
    profiles = [estimate_profile(machine, topology_preset(key), key) for machine, key in TARGETS]
    profiles += [estimate_testbed(tb) for tb in paper_testbeds()]
    for prof in profiles:
        path = prof.save(f"{args.out}/{prof.name}.estimated.json")
        print(f"wrote {path}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-profile-estimate``


if __name__ == "__main__":
    cli()
