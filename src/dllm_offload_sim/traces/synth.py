"""Synthetic trace generator: semi-autoregressive block-diffusion decoding with evolving MoE routing.

The model of a request (all knobs are fields of :class:`SynthConfig`):

* Prefill routes the prompt rows that precede the first decode block (``floor(P/B)*B``, or ``B``
  when the prompt is shorter than a block), as dInfer does for LLaDA2.
* Decoding goes block by block. Each masked token has a confidence logit that starts at
  ``N(conf_init_mean, conf_init_std)`` and rises by ``conf_gain`` per denoising step (plus noise).
  Each forward unmasks every masked token whose confidence reaches ``threshold``, or the most
  confident one if none does (dInfer's threshold decoder). When a block has no masks left, one
  commit forward re-routes it.
* Routing score of token row t, layer l, expert e:
  ``base[l, e] + block_scale * ctx[l, e] + token_scale * z[t, l, e]``; experts are chosen by
  LLaDA2's group-limited top-k. ``base`` is a per-layer popularity whose spread varies across layers
  (heterogeneous activation), ``ctx`` is a block context that is partly carried across a block
  boundary (``block_carry``; new tokens' latents likewise start correlated, ``token_carry``), and ``z`` is a per-token latent that drifts between denoising steps as
  ``z <- rho * z + sqrt(1 - rho^2) * noise`` with ``rho`` rising with the token's confidence
  (``stability_low`` at confidence 0 to ``stability_high`` at 1; ``stability_decoded`` for tokens
  already unmasked). So high-confidence tokens keep their experts more often.

Calibration targets of the defaults (paper §3.1, §3.3 on LLaDA2.0-mini, block 16), checked by
``tests/test_synth.py``: adjacent-iteration overlap 85-90%, block-boundary overlap > 65%,
about 60 distinct experts per MoE layer per forward, about 2.5 tokens decoded per forward.
``--calibration small-trained`` instead matches the collected traces of the small trained model
(:data:`CALIBRATIONS`).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.routing import combine_weights, group_limited_topk
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL, RequestArrays
from dllm_offload_sim.traces.topology import ModelTopology, topology_preset
from dllm_offload_sim.traces.writer import write_trace
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point


@dataclass
class SynthConfig:
    """Parameters of the synthetic generator; defaults are calibrated to LLaDA2.0-mini (paper §3)."""

    model: str = "mini"  # a catalogue model (mini, flash, qwen3-30b-a3b, ...; docs/models.md) or a model file
    n_requests: int = 4  # requests in the trace
    seed: int = 0  # RNG seed; same config + seed => identical trace
    block_length: int = 16  # tokens per diffusion block (paper default 16)
    max_new_tokens: int = 256  # tokens generated per request (rounded up to whole blocks)
    prompt_len_min: int = 40  # shortest prompt (tokens)
    prompt_len_max: int = 200  # longest prompt (tokens)
    threshold: float = 0.9  # confidence at which a masked token is unmasked (dInfer default)
    conf_init_mean: float = 0.8  # mean confidence logit of a masked token at its block's first step
    conf_init_std: float = 1.5  # spread of that logit across tokens
    conf_gain: float = 1.0  # rise of the confidence logit per denoising step
    conf_noise: float = 0.3  # per-step noise on the confidence logit
    layer_skew_min: float = 0.2  # smallest per-layer spread of expert popularity logits
    layer_skew_max: float = 1.5  # largest spread (more spread = fewer distinct experts)
    block_scale: float = 1.0  # weight of the block context in routing scores
    block_carry: float = 0.9  # correlation of the block context across a block boundary
    token_scale: float = 1.4  # weight of the per-token latent in routing scores
    token_carry: float = 0.8  # correlation of a new block's token latents with the previous block's
    stability_low: float = 0.75  # step-to-step latent correlation of a token at confidence 0
    stability_high: float = 0.995  # ... at confidence 1
    stability_decoded: float = 0.99  # ... of a token already unmasked (or a prompt token)
    first_request_id: int = 0  # id of the first request (to merge traces)

    def validate(self) -> None:
        problems = []
        for name in ("n_requests", "block_length", "max_new_tokens", "prompt_len_min"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be > 0")
        if self.prompt_len_max < self.prompt_len_min:
            problems.append(f"prompt_len_max={self.prompt_len_max} < prompt_len_min={self.prompt_len_min}")
        if self.seed < 0 or self.first_request_id < 0:
            problems.append(f"seed={self.seed} and first_request_id={self.first_request_id} must be >= 0")
        if not 0 < self.threshold <= 1:
            problems.append(f"threshold={self.threshold} must be in (0, 1]")
        for name in ("block_carry", "token_carry", "stability_low", "stability_high", "stability_decoded"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name}={getattr(self, name)} must be in [0, 1]")
        if self.layer_skew_max < self.layer_skew_min:
            problems.append("layer_skew_max must be >= layer_skew_min")
        if problems:
            raise ValueError("invalid synthetic trace config: " + "; ".join(problems))


# Named knob sets. ``paper-mini`` (the defaults) matches the paper's LLaDA2.0-mini statistics; ``paper-flash`` its
# LLaDA2.0-flash ones (about 90 activated experts per MoE layer per iteration, Fig. 10c and §5.2, with the same
# overlaps): flatter expert popularity and a weaker block context spread the routes, and steadier tokens and
# blocks keep the overlaps in the paper's bands; ``small-trained`` matches the traces collected from this project's small trained model
# (traces/data/llada2_small_*: it reaches the 0.9 threshold less often, ~1.3 tokens per forward,
# and its routing is mostly re-drawn at a block boundary); tests/test_synth.py checks both.
CALIBRATIONS = {
    "paper-mini": {},
    "paper-flash": {
        "layer_skew_min": 0.05,
        "layer_skew_max": 0.7,
        "block_scale": 0.4,
        "token_scale": 1.6,
        "stability_low": 0.85,
        "stability_decoded": 0.997,
        "block_carry": 0.97,
        "token_carry": 0.9,
    },
    "small-trained": {
        "conf_init_mean": -0.5,
        "conf_init_std": 0.6,
        "conf_gain": 0.4,
        "block_carry": 0.15,
        "token_carry": 0.0,
        "block_scale": 2.2,
        "token_scale": 3.0,
        "layer_skew_min": 0.1,
        "layer_skew_max": 0.8,
        "stability_low": 0.85,
        "stability_high": 0.85,
    },
}


def calibrated_config(calibration: str = "paper-mini", **overrides) -> SynthConfig:
    """A :class:`SynthConfig` from a named calibration, with explicit fields on top."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown calibration {calibration!r}; choose one of {sorted(CALIBRATIONS)}")
    return SynthConfig(**{**CALIBRATIONS[calibration], **overrides})


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 precision (the model's weight dtype); keeps traces small."""
    v = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((v + 0x7FFF + ((v >> 16) & 1)) & 0xFFFF0000).view(np.float32)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class _Router:
    """Turns routing scores into (ids, weights) with LLaDA2's group-limited top-k."""

    def __init__(self, topo: ModelTopology):
        self.topo = topo

    def __call__(self, scores: np.ndarray):
        t = self.topo
        ids = group_limited_topk(scores, t.n_group, t.topk_group, t.top_k)
        w = combine_weights(_sigmoid(scores - 2.0), ids)
        return ids.astype(np.int16), round_to_bf16(w)


def generate_request(
    cfg: SynthConfig, topo: ModelTopology, request_id: int, rng: np.random.Generator, base: np.ndarray
) -> RequestArrays:
    """One synthetic request: prefill, then block-by-block denoising with commit forwards."""
    L, E, B = topo.n_moe_layers, topo.n_experts, cfg.block_length
    route = _Router(topo)
    P = int(rng.integers(cfg.prompt_len_min, cfg.prompt_len_max + 1))
    first_block_start = (P // B) * B
    n_prefill = first_block_start if first_block_start > 0 else P  # prompt rows before the first decode block
    end = -(-(P + cfg.max_new_tokens) // B) * B  # generation extended to a block boundary

    phase, block, sib, kv, ndec, ntok = [], [], [], [], [], []
    ids_rows, w_rows, conf_rows, mask_rows, dec_rows = [], [], [], [], []
    ctx = rng.standard_normal((L, E))

    def emit(ph, blk, s_in_b, kv_len, n_decoded, ids, w, conf, was_masked, decoded):
        phase.append(ph)
        block.append(blk)
        sib.append(s_in_b)
        kv.append(kv_len)
        ndec.append(n_decoded)
        ntok.append(ids.shape[0])
        ids_rows.append(ids)
        w_rows.append(w)
        conf_rows.append(conf.astype(np.float32))
        mask_rows.append(was_masked)
        dec_rows.append(decoded)

    # prefill over the prompt rows before the first decode block
    z = rng.standard_normal((n_prefill, L, E))
    ids, w = route(base + cfg.block_scale * ctx + cfg.token_scale * z)
    emit(
        PREFILL,
        0,
        0,
        0,
        0,
        ids,
        w,
        np.full(n_prefill, np.nan),
        np.zeros(n_prefill, bool),
        np.zeros(n_prefill, bool),
    )

    for start in range(first_block_start, end, B):
        b = start // B
        ctx = cfg.block_carry * ctx + np.sqrt(1 - cfg.block_carry**2) * rng.standard_normal((L, E))
        pos = np.arange(start, start + B)
        masked = pos >= P  # prompt tail tokens in the first block are never masked
        conf_logit = rng.normal(cfg.conf_init_mean, cfg.conf_init_std, B)
        conf = np.full(B, np.nan)  # prompt rows have no prediction confidence
        fresh = rng.standard_normal((B, L, E))
        z = fresh if z.shape[0] != B else cfg.token_carry * z + np.sqrt(1 - cfg.token_carry**2) * fresh
        j = 0
        while True:
            ids, w = route(base + cfg.block_scale * ctx + cfg.token_scale * z)
            was_masked = masked.copy()
            if masked.any():
                c_now = _sigmoid(conf_logit + cfg.conf_gain * j + cfg.conf_noise * rng.standard_normal(B))
                conf = np.where(masked, c_now, conf)
                cand = np.where(masked, conf, -np.inf)
                thr = min(cfg.threshold, cand.max() - 1e-5)
                decoded = masked & (cand >= thr)
                masked = masked & ~decoded
                emit(DENOISE, b, j, start, int(decoded.sum()), ids, w, conf, was_masked, decoded)
                # latent drift to the next forward: stable for confident and for decoded tokens
                rho = np.where(
                    was_masked,
                    cfg.stability_low + (cfg.stability_high - cfg.stability_low) * conf,
                    cfg.stability_decoded,
                )[:, None, None]
                z = rho * z + np.sqrt(1 - rho**2) * rng.standard_normal(z.shape)
                j += 1
            else:  # commit forward: the finished block rewrites its KV cache
                emit(COMMIT, b, j, start, 0, ids, w, conf, was_masked, np.zeros(B, bool))
                break

    row_offset = np.zeros(len(ntok) + 1, np.int64)
    np.cumsum(ntok, out=row_offset[1:])
    return RequestArrays(
        request_id=request_id,
        phase=np.array(phase, np.int8),
        block=np.array(block, np.int32),
        step_in_block=np.array(sib, np.int32),
        kv_len=np.array(kv, np.int32),
        n_decoded=np.array(ndec, np.int32),
        row_offset=row_offset,
        ids=np.concatenate(ids_rows),
        weights=np.concatenate(w_rows),
        confidence=np.concatenate(conf_rows).astype(np.float32),
        was_masked=np.concatenate(mask_rows),
        decoded=np.concatenate(dec_rows),
        prompt_len=P,
        prompt_hash=hashlib.sha256(f"synthetic:{cfg.seed}:{request_id}".encode()).hexdigest()[:16],
    )


def layer_popularity(cfg: SynthConfig, topo: ModelTopology, rng: np.random.Generator) -> np.ndarray:
    """Per-layer expert popularity logits ``[L, E]`` with a spread that differs across layers."""
    L, E = topo.n_moe_layers, topo.n_experts
    skew = rng.permutation(np.linspace(cfg.layer_skew_min, cfg.layer_skew_max, L))
    return skew[:, None] * rng.standard_normal((L, E))


def generate(cfg: SynthConfig, progress: bool = False):
    """Yield the requests of a synthetic trace (deterministic in ``cfg``, including its seed)."""
    cfg.validate()
    topo = topology_preset(cfg.model)
    rng = np.random.default_rng(cfg.seed)
    base = layer_popularity(cfg, topo, rng)
    it = range(cfg.n_requests)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="synthesising requests", unit="req")
    for i in it:
        req_rng = np.random.default_rng([cfg.seed, i])
        yield generate_request(cfg, topo, cfg.first_request_id + i, req_rng, base)


MAX_REQUEST_MEMORY = 4 << 30  # bytes one request's routing scores may take while it is generated


def expected_size(cfg: SynthConfig, topo: ModelTopology) -> tuple[float, float]:
    """(bytes on disk, bytes of memory for one request) a trace of ``cfg`` is expected to take: each request's rows
    are its prompt's plus, per decoded token, about half a block of re-routed rows; a row holds top-k ids and weights
    per MoE layer (about half of it after Parquet's compression); a request's prefill scores every expert of every
    layer for each prompt row (float64)."""
    rows = (cfg.prompt_len_min + cfg.prompt_len_max) / 2 + cfg.max_new_tokens * cfg.block_length / 2
    disk = cfg.n_requests * rows * topo.n_moe_layers * topo.top_k * 4 / 2
    memory = max(cfg.prompt_len_max, cfg.block_length) * topo.n_moe_layers * topo.n_experts * 8
    return disk, memory


def write_synthetic_trace(cfg: SynthConfig, out, overwrite: bool = False, progress: bool = False) -> Path:
    """Generate a synthetic trace and write it atomically to ``out``. A trace whose expected size exceeds the free
    space where it is written, or one request too large to generate in memory, is refused before anything runs."""
    cfg.validate()
    topo = topology_preset(cfg.model)
    disk, memory = expected_size(cfg, topo)
    if memory > MAX_REQUEST_MEMORY:
        raise ValueError(
            f"prompt_len_max={cfg.prompt_len_max}: a request's prompt needs about {memory / 2**30:.0f} GiB "
            f"of routing scores to generate (at most {MAX_REQUEST_MEMORY >> 30} GiB); use shorter prompts"
        )
    where = Path(out).resolve().parent
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if disk > free:
        raise ValueError(
            f"n_requests={cfg.n_requests}, max_new_tokens={cfg.max_new_tokens}: the trace would take about "
            f"{disk / 1e9:.1f} GB and {where} has {free / 1e9:.1f} GB free; nothing was written"
        )
    if disk > 1e9 and progress:
        print(f"writing about {disk / 1e9:.1f} GB", file=sys.stderr)
    decoding = {
        "block_length": cfg.block_length,
        "threshold": cfg.threshold,
        "max_new_tokens": cfg.max_new_tokens,
        "batch_size": 1,
    }
    return write_trace(
        out,
        topo,
        generate(cfg, progress=progress),
        source="synthetic",
        decoding=decoding,
        dataset="synthetic",
        extra={"generator": dataclasses.asdict(cfg)},
        overwrite=overwrite,
    )


def field_comment(cls, name: str) -> str:
    """The inline ``# comment`` after a dataclass field's definition (used as its --help text)."""
    import inspect

    for line in inspect.getsource(cls).splitlines():
        if line.strip().startswith(f"{name}:") and "#" in line:
            return line.split("#", 1)[1].strip()
    return ""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dllm-synth",
        description="Generate a synthetic LLaDA2 MoE routing trace (Parquet trace directory).",
        epilog="Example: dllm-synth --out traces_out/mini16 --model mini --n-requests 8 --block-length 16\n"
        "         dllm-synth --figure-traces      # the traces dllm-sim experiment=fig12 ... fig17b read",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--out",
        help="trace directory to create (with --figure-traces: their folder, default "
        "outputs/fig_traces, where the experiments look)",
    )
    p.add_argument(
        "--figure-traces",
        action="store_true",
        help="write every trace the paper's figure experiments (conf/experiment/fig*.yaml) read into "
        "--out instead of one trace; the flags below do not apply",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing trace at --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--calibration",
        default="paper-mini",
        choices=sorted(CALIBRATIONS),
        help="named knob set the flags below start from: paper-mini (the paper's LLaDA2.0-mini "
        "statistics), paper-flash (its LLaDA2.0-flash ones: about 90 activated experts per layer; "
        "with --model flash) or small-trained (the shipped collected traces) (default: paper-mini)",
    )
    for f in dataclasses.fields(SynthConfig):
        help_text = field_comment(SynthConfig, f.name)
        p.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(f.default),
            default=argparse.SUPPRESS,
            help=f"{help_text} (default: {f.default})",
        )
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.figure_traces:
        from dllm_offload_sim.traces.figure_traces import DEFAULT_DIR, make_figure_traces

        out = Path(args.out or DEFAULT_DIR)
        try:
            made = make_figure_traces(out)
        except (ValueError, TraceError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {len(made)} traces to {out} ({', '.join(sorted(made))})")
        return 0
    if args.out is None:
        parser.error("--out is required (the trace directory to create), or --figure-traces")
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(SynthConfig) if hasattr(args, f.name)}
    try:
        cfg = calibrated_config(args.calibration, **given)
        out = write_synthetic_trace(cfg, args.out, overwrite=args.overwrite, progress=not args.quiet)
    except (ValueError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-synth``


if __name__ == "__main__":
    cli()
