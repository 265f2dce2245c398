"""Training throughput of the LLaDA2-topology model: data tokens per second and model FLOP utilisation of
``dllm-train``'s own step (block-diffusion objective, AdamW, router-bias update) per batch size, eager and
``torch.compile``'d, windows sampled ahead from the stdlib corpus as in a real run.

    python bench/bench_train.py [--preset small-mini] [--batches 32,128,256] [--compile off,on] [--steps 20]
                                [--json out.json]

Prints one row per configuration: tokens/s, MFU against the GPU's dense bf16 peak, ms per step, peak GPU memory
and the warm-up time (compilation included). The target of the confident-model issue is >= 1 M tokens/s on one
H200. Runs on a CPU too (``--preset tiny``), where the numbers only check that it works.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from dllm_offload_sim.models.llada2.train.corpus import PrefetchedBatches
from dllm_offload_sim.models.llada2.train.objective import block_diffusion_mask
from dllm_offload_sim.models.llada2.train.throughput import peak_tflops, train_step_flops
from dllm_offload_sim.models.llada2.train.train import (LR, PRESETS, SEQ_LEN, BLOCK, autocast_for, build_corpus,
                                                        optimizer, train_step, training_model)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(preset: str, batch: int, compile: bool, steps: int, warmup: int, seq_len: int, block: int,
            device: str, corpus, peak: float | None) -> dict:
    """Warm up, then time ``steps`` training steps of a fresh model; one row of the table."""
    torch.manual_seed(0)
    cfg = PRESETS[preset]()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    model = training_model(cfg, device, compile)
    opt, amp = optimizer(model, LR, device), autocast_for(device)
    gen = torch.Generator(device=device).manual_seed(0)
    mask = block_diffusion_mask(seq_len, block, device)
    batches = PrefetchedBatches(corpus, np.random.default_rng(0), batch, seq_len, device)
    try:
        t0 = time.perf_counter()
        for _ in range(warmup):
            st = train_step(model, opt, batches.next(), block, gen, mask, amp)
        sync(device)
        t_warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(steps):
            st = train_step(model, opt, batches.next(), block, gen, mask, amp)
        sync(device)
        dt = (time.perf_counter() - t0) / steps
    finally:
        batches.close()
    tok_s = batch * seq_len / dt
    flops = train_step_flops(cfg, batch, seq_len)
    return {"preset": preset, "batch": batch, "compile": compile, "seq_len": seq_len, "ms_per_step": round(dt * 1e3, 2),
            "tokens_per_s": round(tok_s, 1), "tflops": round(flops / dt / 1e12, 3),
            "mfu": round(flops / dt / (peak * 1e12), 5) if peak else None,
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.startswith("cuda") else None,
            "warmup_s": round(t_warm, 1), "loss": round(float(st["loss"]), 4)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small-mini", choices=sorted(PRESETS))
    p.add_argument("--batches", default="32,128,256", help="windows per step, comma-separated")
    p.add_argument("--compile", default="off,on", help="off, on, or off,on")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--block", type=int, default=BLOCK)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: known GPUs)")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    modes = {"off": False, "on": True}
    try:
        batches = [int(b) for b in a.batches.split(",")]
        compiles = [modes[c] for c in a.compile.split(",")]
    except (ValueError, KeyError):
        p.error(f"--batches {a.batches!r} needs integers and --compile {a.compile!r} off and/or on")
    peak = a.peak_tflops or (peak_tflops(torch.cuda.get_device_name()) if a.device.startswith("cuda") else None)
    corpus = build_corpus(None, [])
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"# {dev_name}, torch {torch.__version__}, preset {a.preset}, seq_len {a.seq_len}, block {a.block}, "
          f"{a.steps} timed steps after {a.warmup}; peak {peak} TFLOP/s")
    print(f"{'batch':>6} {'compile':>7} {'ms/step':>9} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>7} {'peak GiB':>8} "
          f"{'warm-up s':>9}")
    rows = []
    for c in compiles:
        for b in batches:
            try:
                r = measure(a.preset, b, c, a.steps, a.warmup, a.seq_len, a.block, a.device, corpus, peak)
            except torch.OutOfMemoryError:
                print(f"{b:>6} {str(c):>7}  out of GPU memory", flush=True)
                torch.cuda.empty_cache()
                continue
            rows.append(r)
            print(f"{b:>6} {str(c):>7} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>11,.0f} {r['tflops']:>8.2f} "
                  f"{(r['mfu'] or 0):>7.2%} {(r['peak_gib'] or 0):>8.2f} {r['warmup_s']:>9.1f}", flush=True)
            torch._dynamo.reset()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev_name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
