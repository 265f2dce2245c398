"""``dllm-train``: train a small LLaDA2-topology dLLM from scratch (masked block diffusion).

The model has LLaDA2.0-mini's routing topology (20 layers, layer 0 dense, 256 routed experts, top-8,
8 groups / top-4, sigmoid router with expert bias, 1 shared expert) at small widths, so its traces
replay at mini shapes (``dllm-trace-collect --shape mini``). Router balance follows LLaDA2's
auxiliary-loss-free scheme: after every step each expert's bias moves by ``bias_rate`` towards the
mean load. ``--ar-fraction`` trains the first part of the steps autoregressively (blocks of one token)
before block diffusion, as LLaDA2 was converted from an autoregressive model. Seeded; ``--budget-s`` fixes the number of steps from the speed of steps 10-40 (after
warm-up and the first evaluation; the chosen number is logged, and ``--steps N`` reruns the same
schedule). Resumable (``--resume``, ``--stop-at``: ``train_state.py``); data-parallel over several GPUs
(``--gpus``: ``data_parallel.py``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dllm_offload_sim.models.llada2.config import LLaDA2Config
from dllm_offload_sim.models.llada2.loader import save_checkpoint
from dllm_offload_sim.models.llada2.train.corpus import (
    MASK,
    PROMPT_TEMPLATE,
    Corpus,
    PrefetchedBatches,
    jsonl_documents,
    site_packages_documents,
    stdlib_documents,
)
from dllm_offload_sim.models.llada2.train.data_parallel import DataParallel, from_env, leave, spawn
from dllm_offload_sim.models.llada2.train.objective import (
    ATTENTIONS,
    attention_mask,
    block_diffusion_mask,
    diffusion_loss,
)
from dllm_offload_sim.models.llada2.train.presets import PRESETS, small_mini_config
from dllm_offload_sim.models.llada2.train.run_files import plot_loss, write_samples
from dllm_offload_sim.models.llada2.train.step import (
    CAPACITY_FACTOR,
    autocast_for,
    block_at,
    lr_at,
    optimizer,
    parse_block_stages,
    train_step,
    training_model,
)
from dllm_offload_sim.models.llada2.train.throughput import active_parameters, peak_tflops, train_step_flops
from dllm_offload_sim.models.llada2.train.train_state import STATE_FILE, TrainState
from dllm_offload_sim.traces.atomic import atomic_write_json, atomic_write_text
from dllm_offload_sim.traces.cli import HelpFormatter, positive_float
from dllm_offload_sim.traces.errors import TraceError

# ---- defaults (one line each) -------------------------------------------------------------------
SEQ_LEN = 256  # tokens per training window (16 blocks)
BLOCK = 16  # block length of the objective (the paper's decoding default)
BATCH = 32  # windows per step
STEPS = 3000  # optimiser steps (unless --budget-s picks them)
LR = 1.5e-3  # peak AdamW learning rate
LOG_EVERY = 25  # steps between training-log rows
VAL_EVERY = 250  # steps between held-out evaluations
SAMPLE_TOKENS = 128  # tokens decoded per sample prompt at the end
STATE_EVERY_S = 300.0  # seconds between resumable training states (train_state.pt), at log steps
CODE_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    'import os\n\n\ndef list_python_files(root):\n',
)


def build_corpus(
    stdlib_root: str | None,
    jsonl: list[str],
    site_packages: bool = False,
    weights: dict[str, float] | None = None,
) -> Corpus:
    """The training sources: ``python-stdlib``, ``python-site-packages`` if asked, and one per JSONL file (named
    by its file's stem), sampled by ``weights`` (uniformly by default)."""
    sources = {"python-stdlib": stdlib_documents(stdlib_root)}
    if site_packages:
        sources["python-site-packages"] = site_packages_documents()
    for path in jsonl:
        sources[Path(path).stem] = jsonl_documents(path)
    return Corpus.build(sources, weights=weights)


@torch.no_grad()
def evaluate(
    model,
    corpus: Corpus,
    block: int,
    batches: int,
    batch: int,
    seq_len: int,
    device,
    amp,
    dp: DataParallel = DataParallel(),
) -> float:
    """Held-out objective value on fixed windows and fixed masks (seed 1234): ``batches`` global batches of
    ``dp``'s world x ``batch`` windows, each process evaluating its shard."""
    model.eval()
    rng, gen = np.random.default_rng(1234), torch.Generator(device=device).manual_seed(1234)
    mask = block_diffusion_mask(seq_len, block, device)
    rows = dp.shard.rows(batch)
    tot = torch.zeros((), device=device)
    for _ in range(batches):
        x0 = torch.from_numpy(corpus.sample(rng, batch * dp.shard.world, seq_len, "val")[rows]).to(device)
        with amp():
            loss, _ = diffusion_loss(model.forward_masked, x0, block, MASK, gen, mask, dp.shard)
        tot += loss.float()
    model.train()
    return float(dp.mean(tot)) / batches


def train(
    out: Path,
    steps: int | None = STEPS,
    budget_s: float | None = None,
    batch: int = BATCH,
    seq_len: int = SEQ_LEN,
    block: int = BLOCK,
    lr: float = LR,
    seed: int = 0,
    device: str = "cpu",
    stdlib_root: str | None = None,
    jsonl: tuple[str, ...] = (),
    sample_jsonl: str | None = None,
    config: LLaDA2Config | None = None,
    progress: bool = True,
    sample_tokens: int = SAMPLE_TOKENS,
    peak: float | None = None,
    compile: bool = False,
    ar_fraction: float = 0.0,
    site_packages: bool = False,
    weights: dict[str, float] | None = None,
    dp: DataParallel | None = None,
    capacity_factor: float | None = CAPACITY_FACTOR,
    resume: bool = False,
    stop_at: int | None = None,
    state_every_s: float | None = STATE_EVERY_S,
    confidence_weight: float = 0.0,
    block_stages: tuple = (),
    attention: str = "sdpa",
) -> dict | None:
    """Train, then write the checkpoint, ``train_log.csv``, ``loss_curve.png``, ``samples.md`` and
    ``train_summary.json`` into ``out``; returns the summary. Throughput (data tokens per second) and model FLOP
    utilisation against ``peak`` TFLOP/s (default: the GPU's dense bf16 peak where known) are measured over the
    training steps, evaluations excluded. ``compile`` runs the decoder layers through ``torch.compile``;
    ``ar_fraction`` of the steps train autoregressively first (:func:`block_at`); ``site_packages`` adds the
    installed packages' Python sources to the corpus, and ``weights`` weighs its sources by name.
    ``confidence_weight`` adds LLaDA2.0's CAP term to the objective (``objective.py``; 0: none).
    ``block_stages`` trains with other block lengths first (:func:`block_at`; ``ar_fraction`` F is the stage
    ``(1, F)``). ``attention``: how the training step attends under the block-diffusion mask (``objective.ATTENTIONS``:
    ``sdpa`` over every pair, or ``flex``, FlexAttention skipping the empty tiles, GPU only); evaluation uses ``sdpa``.

    In a data-parallel run ``dp`` is this process's place (its device replaces ``device``): every process trains
    ``batch`` windows of each step's global batch of ``dp``'s world x ``batch``, and the run is the one a single
    process would train with that global batch (same windows, noise and schedule), up to the order of floating-point
    sums. Only the main process (rank 0) writes files and returns the summary; the others return ``None``.

    Resumable: every ``state_every_s`` seconds (at a log step, once the schedule is fixed) the run's state goes to
    ``out/train_state.pt`` (:class:`TrainState`), and ``resume`` continues from it as the uninterrupted run would
    have gone on; a finished run removes it. ``stop_at`` ends the run after that many steps with its state saved
    (a run in parts): the main process then returns ``{"stopped_at": step, "state": path}``."""
    dp = dp or DataParallel(device=device)
    device, main, world = dp.device, dp.shard.main, dp.shard.world
    if attention not in ATTENTIONS:
        raise TraceError(f"attention {attention!r}: expected one of {', '.join(ATTENTIONS)}")
    if attention == "flex" and not device.startswith("cuda"):
        raise TraceError(
            f"attention flex on {device}: FlexAttention has no backward on a CPU; use sdpa there"
        )
    if not 0 <= ar_fraction < 1:
        raise TraceError(f"ar_fraction {ar_fraction} must be in [0, 1): the run must end on block diffusion")
    if ar_fraction and block_stages:
        raise TraceError(
            "ar_fraction and block_stages both set: give the autoregressive stage as (1, fraction)"
        )
    out = Path(out)
    if main:
        out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg = config or small_mini_config()
    stages = ((1, ar_fraction),) if ar_fraction else tuple(tuple(s) for s in block_stages)
    corpus = build_corpus(stdlib_root, list(jsonl), site_packages, weights)
    settings = {
        "steps": steps,
        "budget_s": budget_s,
        "batch": batch,
        "seq_len": seq_len,
        "block": block,
        "lr": lr,
        "seed": seed,
        "world": world,
        "ar_fraction": ar_fraction,
        "capacity_factor": capacity_factor,
        "confidence_weight": confidence_weight,
        "block_stages": [list(s) for s in stages],
        "corpus": corpus.describe(),
        "config": json.dumps(asdict(cfg), sort_keys=True),
    }
    state = None
    if (out / STATE_FILE).exists():
        if not resume:
            raise TraceError(
                f"{out / STATE_FILE}: {out} holds an unfinished run; pass --resume to continue it, or "
                f"choose another --out"
            )
        state = TrainState.load(out, settings)
    elif resume and (out / "train_summary.json").exists():
        raise TraceError(f"{out}: the run there has finished (train_summary.json); nothing to resume")
    if budget_s and stop_at is not None and stop_at <= 40:
        raise TraceError(
            f"stop_at {stop_at}: with a time budget the schedule is fixed after step 40; stop later"
        )
    if main:
        print(
            f"corpus: {corpus.describe()}"
            + (f"; {world} data-parallel processes" if world > 1 else "")
            + (f"; resuming at step {state.step} of {state.total}" if state else ""),
            flush=True,
        )
    model = training_model(cfg, device, compile, capacity_factor)
    n_params = sum(p.numel() for p in model.parameters())
    opt = optimizer(model, lr, device)
    if state:
        model.load_state_dict(state.model)
        opt.load_state_dict(state.optimizer)
        rng.bit_generator.state = state.sampler_state
        gen.set_state(state.noise_state)
    forward = dp.training_forward(model)
    cuda = device.startswith("cuda")
    amp = autocast_for(device)
    masks = {b: attention_mask(seq_len, b, device, attention) for b in {block, *(s[0] for s in stages)}}
    peak = peak or (peak_tflops(torch.cuda.get_device_name()) if cuda else None)
    step_flops = train_step_flops(cfg, batch, seq_len)
    rows, total, t0, step, train_s = [], steps, time.perf_counter(), 0, 0.0
    if state:
        rows, total, step, train_s = state.rows, state.total, state.step, state.train_s
        t0 -= state.elapsed_s
    t_window, step_window = (
        time.perf_counter(),
        step,
    )  # the training time since the last log row, evaluations excluded
    t_state = time.perf_counter()
    bar = None
    if progress and main:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=step, desc="training", unit="step")
    probe0, probe = 10, 40  # --budget-s times steps probe0..probe (after warm-up, first evaluation)
    t_probe = t0
    stopped = False
    # sampled ahead in a thread (a daemon blocked on its full queue if the loop stops early)
    batches = PrefetchedBatches(corpus, rng, batch, seq_len, device, shard=dp.shard)
    while total is None or step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total or 10**9, lr)
        x0 = batches.next()
        blk = block_at(step, total or 10**9, block, stages)
        st = train_step(model, opt, x0, blk, gen, masks[blk], amp, dp, forward, confidence_weight)
        step += 1
        if total is None and step in (probe0, probe):  # --budget-s: fix the schedule from the measured speed
            if cuda:
                torch.cuda.synchronize()
            if step == probe0:
                t_probe = time.perf_counter()
            else:
                per = dp.agree((time.perf_counter() - t_probe) / (probe - probe0), "max")
                left = dp.agree(budget_s - (time.perf_counter() - t0), "min")
                total = max(probe + 1, probe + int(left / (per * 1.06)))  # 6% for evaluation and logging
                if main:
                    print(f"--budget-s {budget_s:g}: {per * 1e3:.1f} ms/step -> {total} steps", flush=True)
                if bar is not None:
                    bar.total = total
        if step % LOG_EVERY == 0 or step == total or step == 1 or step == stop_at:
            if cuda:
                torch.cuda.synchronize()
            window = dp.agree(time.perf_counter() - t_window, "max")
            train_s += window
            n = step - step_window
            shard_stats = ("loss", "masked_nll", "masked_acc") + (
                ("confidence_loss",) if confidence_weight else ()
            )
            means = dict(
                zip(shard_stats, dp.mean(torch.stack([st[k].float() for k in shard_stats])).tolist())
            )
            row = {
                "step": step,
                "block": blk,
                "train_loss": means["loss"],
                "masked_nll": means["masked_nll"],
                "masked_acc": means["masked_acc"],
                **({"confidence_loss": means["confidence_loss"]} if confidence_weight else {}),
                "lr": opt.param_groups[0]["lr"],
                "grad_norm": float(st["grad_norm"]),
                "load_imbalance": float(st["imbalance"]),
                "seconds": round(time.perf_counter() - t0, 2),
                "tokens_per_s": round(n * batch * world * seq_len / window, 1),
                "mfu": round(n * step_flops / window / (peak * 1e12), 5) if peak else "",
                "val_loss": "",
            }
            if step % VAL_EVERY == 0 or step == total or step == 1:
                row["val_loss"] = evaluate(model, corpus, block, 4, batch, seq_len, device, amp, dp)
            rows.append(row)
            t_window, step_window = time.perf_counter(), step
            if bar is not None:
                bar.set_postfix(loss=f"{row['train_loss']:.3f}", acc=f"{row['masked_acc']:.2f}")
            stopped = total is not None and step == stop_at and step < total
            due = state_every_s and time.perf_counter() - t_state >= state_every_s
            if total is not None and step < total and (stopped or due):  # a resumable state, off the clock
                if main:
                    TrainState(
                        settings,
                        step,
                        total,
                        rows,
                        train_s,
                        time.perf_counter() - t0,
                        batches.rng_state,
                        gen.get_state(),
                        model.state_dict(),
                        opt.state_dict(),
                    ).save(out)
                t_state = t_window = time.perf_counter()
        if bar is not None:
            bar.update(1)
        if stopped:
            break
    batches.close()
    if bar is not None:
        bar.close()
    if stopped:
        return {"stopped_at": step, "state": str(out / STATE_FILE)} if main else None
    wall = time.perf_counter() - t0
    agree = dp.replicas_agree(model)
    if not main:
        return None
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(out / "train_log.csv", buf.getvalue())
    plot_loss(rows, out / "loss_curve.png")
    for moe in model.moe_layers():
        moe.unfuse_experts()
        moe.capacity_factor = None
    save_checkpoint(model.eval(), out / "checkpoint")
    prompts = list(CODE_PROMPTS)
    if sample_jsonl:
        from dllm_offload_sim.models.llada2.collect import load_prompts

        prompts += [PROMPT_TEMPLATE.format(q) for q in load_prompts(sample_jsonl, "question", 2)]
    samples = write_samples(model, out / "samples.md", prompts, sample_tokens, block)
    tokens = total * batch * world * seq_len
    summary = {
        "steps": total,
        "batch": batch,
        "seq_len": seq_len,
        "block": block,
        "lr": lr,
        "seed": seed,
        "ar_fraction": ar_fraction,
        "block_stages": [list(s) for s in stages],
        "confidence_weight": confidence_weight,
        "compile": compile,
        "attention": attention,
        "world": world,
        "global_batch": batch * world,
        "replicas_agree": agree,
        "tokens_seen": tokens,
        "parameters": n_params,
        "wall_s": round(wall, 1),
        "active_parameters": active_parameters(cfg),
        "train_s": round(train_s, 1),
        "tokens_per_s": round(tokens / train_s, 1) if train_s else None,
        "tokens_per_s_per_gpu": round(tokens / train_s / world, 1) if train_s else None,
        "input_wait_s": round(batches.wait_s, 3),  # this run's steps waiting for their windows (main process)
        "mfu": round(total * step_flops / train_s / (peak * 1e12), 5) if peak and train_s else None,
        "peak_tflops": peak,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "first": rows[0],
        "last": rows[-1],
        "val_bits_per_byte": round(rows[-1]["val_loss"] / math.log(2), 4),
        "corpus": corpus.describe(),
        "config": asdict(cfg),
        "samples": samples,
    }
    atomic_write_json(out / "train_summary.json", summary)
    (out / STATE_FILE).unlink(missing_ok=True)  # the run is complete
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-train",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example (H200, ~5 min): dllm-train --out runs/small_mini "
        "--jsonl gsm8k_train.jsonl --sample-prompts gsm8k_test.jsonl --budget-s 270",
    )
    p.add_argument(
        "--out", required=True, help="run directory (checkpoint/, train_log.csv, loss_curve.png, samples.md)"
    )
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimiser steps (default {STEPS})")
    p.add_argument(
        "--budget-s",
        type=positive_float,
        default=None,
        help="instead of --steps: as many steps as fit in this many seconds, fixed after 20 steps",
    )
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--seq-len", type=int, default=SEQ_LEN)
    p.add_argument("--block", type=int, default=BLOCK)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--stdlib", default=None, help="Python source tree to train on (default: this Python's stdlib)"
    )
    p.add_argument(
        "--jsonl", action="append", default=[], help="question/answer JSONL to train on (repeatable)"
    )
    p.add_argument(
        "--sample-prompts", default=None, help="JSONL whose first 2 questions are decoded as samples"
    )
    p.add_argument(
        "--preset",
        default="small-mini",
        choices=sorted(PRESETS),
        help="model size: small-mini (mini's routing topology, 246M parameters) or tiny (smoke runs)",
    )
    p.add_argument(
        "--sample-tokens", type=int, default=SAMPLE_TOKENS, help="tokens decoded per sample prompt"
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the GPU's dense bf16 peak for the MFU column (default: known for H200, H100, A100)",
    )
    p.add_argument(
        "--compile", action="store_true", help="run the decoder layers through torch.compile while training"
    )
    p.add_argument(
        "--ar-fraction",
        type=float,
        default=0.0,
        help="train the first FRACTION of the steps autoregressively (blocks of one token; default 0)",
    )
    p.add_argument(
        "--block-stages",
        default=None,
        metavar="B:F,...",
        help="train with block length B until the fraction F of the steps, stage by stage, then --block "
        "(e.g. 1:0.1,4:0.2: autoregressive, then blocks of 4); instead of --ar-fraction",
    )
    p.add_argument(
        "--confidence-weight",
        type=float,
        default=0.0,
        metavar="LAMBDA",
        help="add LLaDA2.0's confidence-aware (CAP) term: LAMBDA x the entropy of the correct predictions "
        "(default 0: none)",
    )
    p.add_argument(
        "--attention",
        default="sdpa",
        choices=ATTENTIONS,
        help="attention of the training step: sdpa (every pair, masked) or flex (FlexAttention, skipping the "
        "tiles the block-diffusion mask empties; GPU only); default sdpa",
    )
    p.add_argument(
        "--site-packages",
        action="store_true",
        help="add the Python sources of this Python's installed packages to the corpus",
    )
    p.add_argument(
        "--source-weight",
        action="append",
        default=[],
        metavar="NAME=W",
        help="sampling weight of a corpus source (python-stdlib, python-site-packages, or a JSONL file's "
        "stem); sources not named weigh 1 (repeatable)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        help="train data-parallel over this many GPUs of this host, --batch windows each (default 1; with "
        "--device cpu, this many gloo processes). Under torchrun the launcher's processes are used",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the unfinished run in --out (its train_state.pt) with the same settings",
    )
    p.add_argument(
        "--stop-at",
        type=int,
        default=None,
        metavar="STEP",
        help="stop after STEP steps with the run's state saved; --resume continues it (a run in parts)",
    )
    p.add_argument(
        "--state-every-s",
        type=float,
        default=STATE_EVERY_S,
        help=f"seconds between resumable states written to --out/{STATE_FILE} (default {STATE_EVERY_S:g}; "
        f"0: only at --stop-at)",
    )
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    weights = {}
    for item in a.source_weight:
        name, sep, w = item.partition("=")
        try:
            weights[name] = float(w)
        except ValueError:
            p.error(f"--source-weight {item!r}: needs NAME=WEIGHT with a number")
        if not sep:
            p.error(f"--source-weight {item!r}: needs NAME=WEIGHT")
    if a.seq_len % a.block:
        p.error(f"--seq-len {a.seq_len} is not a multiple of --block {a.block}")
    if not 0 <= a.ar_fraction < 1:
        p.error(f"--ar-fraction {a.ar_fraction} must be in [0, 1): the run must end on block diffusion")
    stages = ()
    if a.block_stages:
        if a.ar_fraction:
            p.error(
                "--block-stages and --ar-fraction: give the autoregressive stage in --block-stages as 1:FRACTION"
            )
        try:
            stages = parse_block_stages(a.block_stages, a.seq_len)
        except ValueError as e:
            p.error(f"--block-stages {a.block_stages}: {e}")
    if a.gpus < 1:
        p.error(f"--gpus {a.gpus} must be at least 1")
    if not a.confidence_weight >= 0:
        p.error(f"--confidence-weight {a.confidence_weight} must be >= 0")
    if a.stop_at is not None and a.stop_at < 1:
        p.error(f"--stop-at {a.stop_at} must be at least 1")
    if a.state_every_s < 0:
        p.error(f"--state-every-s {a.state_every_s} must be >= 0")
    device_type = "cuda" if a.device.startswith("cuda") else "cpu"
    if a.gpus > 1 and a.device not in ("cuda", "cpu"):
        p.error(
            f"--device {a.device} with --gpus {a.gpus}: the processes take GPUs 0..{a.gpus - 1} (or CPUs); pass "
            f"--device cuda (choose GPUs with CUDA_VISIBLE_DEVICES) or --device cpu"
        )
    if a.gpus > 1 and device_type == "cuda" and a.gpus > torch.cuda.device_count():
        p.error(f"--gpus {a.gpus}: this host has {torch.cuda.device_count()} GPU(s)")
    kwargs = dict(
        out=Path(a.out),
        steps=None if a.budget_s else a.steps,
        budget_s=a.budget_s,
        batch=a.batch,
        seq_len=a.seq_len,
        block=a.block,
        lr=a.lr,
        seed=a.seed,
        device=a.device,
        stdlib_root=a.stdlib,
        jsonl=tuple(a.jsonl),
        sample_jsonl=a.sample_prompts,
        config=PRESETS[a.preset](),
        progress=not a.quiet,
        sample_tokens=a.sample_tokens,
        peak=a.peak_tflops,
        compile=a.compile,
        ar_fraction=a.ar_fraction,
        site_packages=a.site_packages,
        weights=weights or None,
        confidence_weight=a.confidence_weight,
        block_stages=stages,
        attention=a.attention,
        resume=a.resume,
        stop_at=a.stop_at,
        state_every_s=a.state_every_s or None,
    )
    try:
        dp = from_env(device_type)
        if dp is not None:  # one of torchrun's processes
            done = False
            try:
                s = train(**kwargs, dp=dp)
                done = True
            finally:
                leave(dp, done)
            if s is None:
                return 0
        elif a.gpus > 1:
            spawn(a.gpus, device_type, _train_rank, kwargs)
            left = Path(a.out) / STATE_FILE  # a finished run removes its state; a stopped one leaves it
            s = (
                {"stopped_at": a.stop_at, "state": str(left)}
                if left.exists()
                else json.loads((Path(a.out) / "train_summary.json").read_text())
            )
        else:
            s = train(**kwargs)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except torch.multiprocessing.ProcessRaisedException as e:
        print(f"error: a training process failed:\n{e}", file=sys.stderr)
        return 2
    if "stopped_at" in s:
        print(
            f"stopped after step {s['stopped_at']}; the state is in {s['state']}: the same command with --resume "
            f"continues the run"
        )
        return 0
    print(
        json.dumps(
            {
                k: s.get(k)
                for k in (
                    "steps",
                    "world",
                    "tokens_seen",
                    "parameters",
                    "active_parameters",
                    "wall_s",
                    "val_bits_per_byte",
                    "tokens_per_s",
                    "tokens_per_s_per_gpu",
                    "mfu",
                    "replicas_agree",
                    "first",
                    "last",
                )
            },
            indent=1,
        )
    )
    return 0


def _train_rank(dp: DataParallel, kwargs: dict) -> None:
    """One process of ``dllm-train --gpus N``."""
    train(**kwargs, dp=dp)
