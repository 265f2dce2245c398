"""Training throughput of the LLaDA2-topology model: data tokens per second and model FLOP utilisation of
``dllm-train``'s own step (block-diffusion objective, AdamW, router-bias update) per batch size, eager and
``torch.compile``'d, windows sampled ahead from the stdlib corpus as in a real run, on one GPU or data-parallel
over several (``--gpus 1,2,4,8``: ``dllm-train --gpus N``'s processes, ``--batch`` windows per GPU).

    python bench/bench_train.py [--preset small-mini] [--batches 32,128,256] [--compile off,on] [--gpus 1]
                                [--steps 20] [--json out.json]

Prints one row per configuration: tokens/s (all GPUs) and per GPU, the scaling efficiency (tokens/s per GPU
against the same configuration on one GPU, when ``--gpus`` lists 1), MFU against the GPU's dense bf16 peak, ms per
step, peak GPU memory, the time a step waited for its windows (input wait: 0 while sampling keeps ahead) and the
warm-up time (compilation included). The target of the confident-model issue is
>= 1 M tokens/s on one H200. Runs on a CPU too (``--preset tiny``, ``--gpus`` then counts gloo processes), where
the numbers only check that it works.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dllm_offload_sim.models.llada2.train.corpus import PrefetchedBatches
from dllm_offload_sim.models.llada2.train.data_parallel import DataParallel, spawn
from dllm_offload_sim.models.llada2.train.objective import ATTENTIONS, attention_mask
from dllm_offload_sim.models.llada2.train.throughput import peak_tflops, train_step_flops
from dllm_offload_sim.models.llada2.train.presets import PRESETS
from dllm_offload_sim.models.llada2.train.step import autocast_for, optimizer, train_step, training_model
from dllm_offload_sim.models.llada2.train.train import BLOCK, LR, SEQ_LEN, build_corpus
from dllm_offload_sim.traces.cli import HelpFormatter


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def op_table(step, n: int, device: str, title: str, top: int = 25) -> str:
    """The operators that take a training step's time: ``n`` steps under torch's profiler, the ``top`` by their own
    time per step: on a GPU its kernels (an operator's time is its kernels', so only kernels are counted), on a CPU
    the host operators. On a GPU, the time the host spent blocked on a full command queue (the GPU the bottleneck)
    is reported apart."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    blocked = "Command Buffer Full"
    events = [
        e
        for e in prof.key_averages()
        if getattr(e, key, 0) > 0 and (not cuda or (e.device_type == DeviceType.CUDA and e.key != blocked))
    ]
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    total = sum(getattr(e, key) for e in events)
    lines = [
        f"## where a step's {'GPU' if cuda else 'CPU'} time goes ({title}; {n} profiled steps, "
        f"{total / n / 1e3:.1f} ms of {'kernels' if cuda else 'operators'} per step)",
        f"{'ms/step':>9} {'share':>6} {'calls/step':>10}  {'kernel' if cuda else 'operator'}",
    ]
    for e in events[:top]:
        t = getattr(e, key)
        lines.append(f"{t / n / 1e3:>9.2f} {t / total:>6.1%} {e.count / n:>10.0f}  {e.key[:110]}")
    if cuda:
        wait = sum(getattr(e, key) for e in prof.key_averages() if e.key == blocked)
        lines.append(
            f"({blocked!r}, the host blocked on a full command queue: {wait / n / 1e3:.1f} ms per step)"
        )
    return "\n".join(lines)


def measure(
    preset: str,
    batch: int,
    compile: bool,
    steps: int,
    warmup: int,
    seq_len: int,
    block: int,
    corpus,
    peak: float | None,
    profile_ops: int,
    attention: str,
    dp: DataParallel,
) -> dict:
    """Warm up, then time ``steps`` training steps of a fresh model (``dp``'s shard, ``batch`` windows per process);
    one row of the table, the slowest process's time."""
    device = dp.device
    torch.manual_seed(0)
    cfg = PRESETS[preset]()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    model = training_model(cfg, device, compile)
    forward = dp.training_forward(model)
    opt, amp = optimizer(model, LR, device), autocast_for(device)
    gen = torch.Generator(device=device).manual_seed(0)
    mask = attention_mask(seq_len, block, device, attention)
    batches = PrefetchedBatches(corpus, np.random.default_rng(0), batch, seq_len, device, shard=dp.shard)
    try:
        t0 = time.perf_counter()
        for _ in range(warmup):
            st = train_step(model, opt, batches.next(), block, gen, mask, amp, dp, forward)
        sync(device)
        t_warm = dp.agree(time.perf_counter() - t0, "max")
        t0, wait0 = time.perf_counter(), batches.wait_s
        for _ in range(steps):
            st = train_step(model, opt, batches.next(), block, gen, mask, amp, dp, forward)
        sync(device)
        dt = dp.agree((time.perf_counter() - t0) / steps, "max")
        wait = dp.agree((batches.wait_s - wait0) / steps, "max")
        if profile_ops and dp.shard.main:
            print(
                op_table(
                    lambda: train_step(model, opt, batches.next(), block, gen, mask, amp, dp, forward),
                    profile_ops,
                    device,
                    f"batch {batch}, compile {compile}, attention {attention}",
                ),
                flush=True,
            )
    finally:
        batches.close()
    world = dp.shard.world
    tok_s = batch * world * seq_len / dt
    flops = train_step_flops(cfg, batch, seq_len)  # per process
    peak_gib = (
        dp.agree(torch.cuda.max_memory_allocated() / 2**30, "max") if device.startswith("cuda") else None
    )
    return {
        "preset": preset,
        "batch": batch,
        "compile": compile,
        "attention": attention,
        "gpus": world,
        "seq_len": seq_len,
        "ms_per_step": round(dt * 1e3, 2),
        "tokens_per_s": round(tok_s, 1),
        "tokens_per_s_per_gpu": round(tok_s / world, 1),
        "tflops": round(flops * world / dt / 1e12, 3),
        "mfu": round(flops / dt / (peak * 1e12), 5) if peak else None,
        "peak_gib": round(peak_gib, 2) if peak_gib is not None else None,
        "input_wait_ms": round(wait * 1e3, 3),
        "warmup_s": round(t_warm, 1),
        "loss": round(float(dp.mean(st["loss"].float())), 4),
    }


def _measure_rank(dp: DataParallel, args: tuple, path: str) -> None:
    """One process of a data-parallel measurement; rank 0 writes the row to ``path``."""
    row = measure(*args, dp=dp)
    if dp.shard.main:
        Path(path).write_text(json.dumps(row))


def measure_on(gpus: int, device: str, *args) -> dict:
    """:func:`measure` in this process (one GPU) or in ``gpus`` data-parallel processes."""
    if gpus == 1:
        return measure(*args, dp=DataParallel(device=device))
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "row.json")
        spawn(gpus, "cuda" if device.startswith("cuda") else "cpu", _measure_rank, args, path)
        return json.loads(Path(path).read_text())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--preset", default="small-mini", choices=sorted(PRESETS))
    p.add_argument("--batches", default="32,128,256", help="windows per step, comma-separated")
    p.add_argument("--compile", default="off,on", help="off, on, or off,on")
    p.add_argument("--gpus", default="1", help="data-parallel GPU counts, comma-separated (e.g. 1,2,4,8)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--block", type=int, default=BLOCK)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: known GPUs)")
    p.add_argument("--json", default=None, help="also write the rows here")
    p.add_argument(
        "--attention", default="sdpa", help="sdpa, flex, or sdpa,flex (flex: FlexAttention, GPU only)"
    )
    p.add_argument(
        "--profile-ops",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile N more steps and print the operators (GPU kernels) that take the time",
    )
    a = p.parse_args(argv)
    modes = {"off": False, "on": True}
    try:
        batches = [int(b) for b in a.batches.split(",")]
        compiles = [modes[c] for c in a.compile.split(",")]
        gpus = [int(g) for g in a.gpus.split(",")]
        attentions = a.attention.split(",")
        if any(x not in ATTENTIONS for x in attentions):
            raise ValueError
    except (ValueError, KeyError):
        p.error(
            f"--batches {a.batches!r} and --gpus {a.gpus!r} need integers, --compile {a.compile!r} off "
            f"and/or on, --attention {a.attention!r} {' and/or '.join(ATTENTIONS)}"
        )
    if "flex" in attentions and not a.device.startswith("cuda"):
        p.error("--attention flex needs a GPU (FlexAttention has no backward on a CPU)")
    if a.device.startswith("cuda") and max(gpus) > torch.cuda.device_count():
        p.error(f"--gpus {a.gpus}: this host has {torch.cuda.device_count()} GPU(s)")
    peak = a.peak_tflops or (
        peak_tflops(torch.cuda.get_device_name()) if a.device.startswith("cuda") else None
    )
    corpus = build_corpus(None, [])
    dev_name = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(
        f"# {dev_name}, torch {torch.__version__}, preset {a.preset}, seq_len {a.seq_len}, block {a.block}, "
        f"{a.steps} timed steps after {a.warmup}; peak {peak} TFLOP/s"
    )
    print(
        f"{'gpus':>4} {'batch':>6} {'compile':>7} {'attn':>5} {'ms/step':>9} {'tokens/s':>11} {'per GPU':>11} "
        f"{'scaling':>7} {'TFLOP/s':>8} {'MFU':>7} {'peak GiB':>8} {'input wait ms':>13} {'warm-up s':>9}"
    )
    rows, single = [], {}
    for att, c, b, g in itertools.product(attentions, compiles, batches, gpus):
        try:
            r = measure_on(
                g,
                a.device,
                a.preset,
                b,
                c,
                a.steps,
                a.warmup,
                a.seq_len,
                a.block,
                corpus,
                peak,
                a.profile_ops if g == 1 else 0,
                att,
            )
        except torch.OutOfMemoryError:
            print(f"{g:>4} {b:>6} {str(c):>7} {att:>5}  out of GPU memory", flush=True)
            torch.cuda.empty_cache()
            continue
        except torch.multiprocessing.ProcessRaisedException as e:
            print(
                f"{g:>4} {b:>6} {str(c):>7} {att:>5}  failed: {str(e).strip().splitlines()[-1]}", flush=True
            )
            continue
        if g == 1:
            single[(b, c, att)] = r["tokens_per_s"]
        base = single.get((b, c, att))
        r["scaling_efficiency"] = round(r["tokens_per_s_per_gpu"] / base, 3) if base else None
        rows.append(r)
        print(
            f"{g:>4} {b:>6} {str(c):>7} {att:>5} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>11,.0f} "
            f"{r['tokens_per_s_per_gpu']:>11,.0f} "
            f"{(format(r['scaling_efficiency'], '.0%') if base else '-'):>7} {r['tflops']:>8.2f} "
            f"{(r['mfu'] or 0):>7.2%} {(r['peak_gib'] or 0):>8.2f} {r['input_wait_ms']:>13.3f} "
            f"{r['warmup_s']:>9.1f}",
            flush=True,
        )
        torch._dynamo.reset()
        if a.json:  # after every row, so a run stopped part-way keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"device": dev_name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
