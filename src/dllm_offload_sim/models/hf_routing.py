"""Routing traces from any Hugging Face ``transformers`` MoE model: ``dllm-trace-record-hf``.

A forward hook on every MoE layer's router records, at every forward, the top-k experts each token row is sent to and
their combine weights; the model decodes its prompts autoregressively (a prefill forward, then one forward per new
token, greedy, with its KV cache) or by blocks as a block-diffusion model does (:func:`record_block_diffusion`), and
the rows go through the interchange format (:mod:`traces.interchange`) into a trace. Confidence is the max output
probability at each row.

Routers are found by their place, not their family: the module a decoder layer's MLP calls ``gate`` (or a module
whose class name ends in ``Router``) in a layer whose MLP has ``experts``. A router that returns ``(logits, weights,
indices)`` (``transformers`` 5) is read as it is; one that returns logits only is turned into top-k softmax weights,
renormalised where the configuration says ``norm_topk_prob``. The model's shape comes from its configuration and its
modules (:func:`topology_of`), and is written as a model file (docs/models.md) beside the trace unless ``--shape``
names a catalogue model whose routing the checkpoint has (a small model with a large model's routing topology,
recorded under the large model's sizes).

Tested on CPU with tiny random-weight OLMoE, Qwen3-MoE and Mixtral models built from configuration.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dllm_offload_sim.traces.catalogue import find_model, model_file_text
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point, positive_int
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.interchange import InterchangeHeader, InterchangeWriter, import_trace
from dllm_offload_sim.traces.topology import ModelTopology

DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def routers(model) -> list[tuple[int, torch.nn.Module]]:
    """(decoder layer id, router module) of every MoE layer of ``model``, in layer order."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise TraceError(
            f"{type(model).__name__}: no decoder layers at model.layers; not a decoder-only model"
        )
    found = []
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None)
        if mlp is None or not hasattr(mlp, "experts"):
            continue  # a dense layer
        gate = getattr(mlp, "gate", None) or next(
            (m for m in mlp.children() if type(m).__name__.endswith("Router")), None
        )
        if gate is None:
            raise TraceError(
                f"layer {i} ({type(mlp).__name__}) has experts but no router module (gate) to hook"
            )
        found.append((i, gate))
    if not found:
        raise TraceError(f"{type(model).__name__}: no MoE layer found (no decoder layer's MLP has experts)")
    return found


def _config_int(cfg, *names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return int(v)
    if default is None:
        raise TraceError(f"{type(cfg).__name__}: none of {names} is set")
    return default


def topology_of(model, name: str | None = None) -> ModelTopology:
    """The model's routing and size facts, from its configuration and which of its layers have routers."""
    cfg = model.config
    moe_layers = tuple(i for i, _ in routers(model))
    n_heads = _config_int(cfg, "num_attention_heads")
    hidden = _config_int(cfg, "hidden_size")
    dense = _config_int(cfg, "intermediate_size", default=0)
    shared = getattr(cfg, "n_shared_experts", None) or getattr(cfg, "num_shared_experts", None)
    if shared is None:
        shared = 1 if getattr(cfg, "shared_expert_intermediate_size", None) else 0
    dtype = getattr(cfg, "dtype", None) or next(model.parameters()).dtype
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, torch.float32)
    return ModelTopology(
        name=name
        or str(getattr(cfg, "_name_or_path", "") or cfg.model_type).rstrip("/").split("/")[-1]
        or "hf-model",
        n_layers=_config_int(cfg, "num_hidden_layers"),
        moe_layers=moe_layers,
        n_experts=_config_int(cfg, "num_experts", "num_local_experts", "n_routed_experts"),
        top_k=_config_int(cfg, "num_experts_per_tok"),
        n_group=_config_int(cfg, "n_group", default=1),
        topk_group=_config_int(cfg, "topk_group", default=1),
        hidden=hidden,
        moe_intermediate=_config_int(cfg, "moe_intermediate_size", "intermediate_size"),
        dtype=DTYPES.get(dtype, "bf16"),
        n_shared_experts=int(shared),
        n_heads=n_heads,
        n_kv_heads=_config_int(cfg, "num_key_value_heads", default=n_heads),
        head_dim=_config_int(cfg, "head_dim", default=hidden // n_heads),
        vocab_size=_config_int(cfg, "vocab_size"),
        dense_intermediate=dense or _config_int(cfg, "moe_intermediate_size", "intermediate_size"),
    )


class RouterRecorder:
    """Forward hooks on every router of ``model``: after a forward, :attr:`last` maps each MoE layer id to its
    (expert ids ``[rows, k]``, weights ``[rows, k]``) for the rows of that forward."""

    def __init__(self, model, top_k: int):
        self.k = top_k
        self.norm = bool(getattr(model.config, "norm_topk_prob", False))
        self.last: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._handles = [g.register_forward_hook(self._hook(i)) for i, g in routers(model)]

    def _hook(self, layer: int):
        def hook(module, args, out):
            self.last[layer] = self._read(out)

        return hook

    def _read(self, out) -> tuple[np.ndarray, np.ndarray]:
        tensors = list(out) if isinstance(out, (tuple, list)) else [out]
        idx = next((t for t in tensors if not t.is_floating_point() and t.shape[-1] == self.k), None)
        if idx is not None:
            w = next(t for t in tensors if t.is_floating_point() and t.shape == idx.shape)
        else:  # logits only: the softmax top-k, as the usual router computes it
            probs = torch.softmax(tensors[0].float().reshape(-1, tensors[0].shape[-1]), dim=-1)
            w, idx = torch.topk(probs, self.k, dim=-1)
            if self.norm:
                w = w / w.sum(-1, keepdim=True)
        idx = idx.reshape(-1, self.k)
        return idx.detach().cpu().numpy().astype(np.int64), w.detach().float().reshape(
            -1, self.k
        ).cpu().numpy()

    def close(self) -> None:
        for h in self._handles:
            h.remove()


@torch.no_grad()
def record_autoregressive(
    model, prompts: list[list[int]], max_new_tokens: int, writer: InterchangeWriter, top_k: int
) -> None:
    """Decode each prompt greedily (a prefill forward, then one forward per new token) and write every forward's
    routing (``top_k`` experts a row) to ``writer``."""
    import inspect

    rec = RouterRecorder(model, top_k)
    # the KV cache's argument: ``cache`` in transformers >= 5.25, ``past_key_values`` before
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    try:
        for rid, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], dtype=torch.long)
            past = None
            for forward in range(max_new_tokens + 1):
                rec.last.clear()
                out = model(input_ids=ids, use_cache=True, **{key: past})
                past = getattr(out, key)
                conf = torch.softmax(out.logits[0].float(), dim=-1).max(-1).values.numpy()
                for layer, (e, w) in sorted(rec.last.items()):
                    for t in range(e.shape[0]):
                        writer.row(rid, forward, layer, t, e[t], w[t], confidence=float(conf[t]))
                ids = out.logits[:, -1:].argmax(-1)
    finally:
        rec.close()


@dataclass(frozen=True)
class BlockDecoding:
    """Block-diffusion decoding as dInfer runs LLaDA2 (``models.llada2.decode``): the new tokens start as
    ``mask_token_id`` and are decoded ``block_length`` at a time; each denoising forward unmasks every masked position
    whose confidence reaches ``threshold`` (at least the most confident one), and a commit forward runs over the
    finished block."""

    block_length: int
    mask_token_id: int
    threshold: float = 0.9


@torch.no_grad()
def record_block_diffusion(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    decoding: BlockDecoding,
    writer: InterchangeWriter,
    top_k: int,
) -> None:
    """Decode each prompt by blocks (:class:`BlockDecoding`) and write every forward's routing to ``writer``: a
    prefill over the prompt, then per block its denoising forwards and its commit forward, each routing the block's
    rows with the positions before the block as its context (``kv_len``).

    No KV cache is kept: each forward runs the sequence up to the block's end and the block's rows are the ones
    recorded, the rows a cached block-diffusion engine computes. A position's token is read from the logits at that
    position, as a diffusion model predicts it; an autoregressive checkpoint's logits predict the next position, so the
    text it writes this way is not meaningful, but its forwards, their rows and their routing are those of
    block-diffusion decoding."""
    from dllm_offload_sim.models.llada2.decode import unmask

    rec = RouterRecorder(model, top_k)
    B, mask = decoding.block_length, decoding.mask_token_id
    try:
        for rid, prompt in enumerate(prompts):
            P = len(prompt)
            x = torch.tensor([list(prompt) + [mask] * max_new_tokens], dtype=torch.long)
            forward = 0

            def run(lo: int, hi: int, phase: str, block: int, step: int, masked, took, conf) -> None:
                for layer, (e, w) in sorted(rec.last.items()):
                    e, w = e[lo:hi], w[lo:hi]
                    for t in range(hi - lo):
                        writer.row(
                            rid, forward, layer, t, e[t], w[t], confidence=float(conf[t]), phase=phase,
                            kv_len=lo, n_decoded=int(took.sum()), block=block, step_in_block=step,
                            was_masked=bool(masked[t]), decoded=bool(took[t]),
                        )  # fmt: skip

            rec.last.clear()
            logits = model(input_ids=x[:, :P]).logits[0]
            none = torch.zeros(P, dtype=torch.bool)
            run(0, P, "prefill", 0, 0, none, none, torch.softmax(logits.float(), -1).max(-1).values)
            forward += 1
            for block, start in enumerate(range(P, P + max_new_tokens, B), start=1):
                end, step = min(start + B, P + max_new_tokens), 0
                while True:
                    seg = x[0, start:end]
                    masked = seg == mask
                    rec.last.clear()
                    p = torch.softmax(model(input_ids=x[:, :end]).logits[0, start:end].float(), -1)
                    conf, x0 = p.max(-1)
                    took = torch.zeros_like(masked)
                    if masked.any():
                        took = unmask(seg, masked, p, conf, x0, decoding.threshold, mask)  # (writes into x)
                    run(start, end, "denoise" if masked.any() else "commit", block, step, masked, took, conf)
                    forward += 1
                    step += 1
                    if not masked.any():  # the commit forward over the finished block
                        break
    finally:
        rec.close()


def record_trace(
    checkpoint,
    prompts: list[list[int]],
    max_new_tokens: int,
    out,
    shape: str | None = None,
    overwrite: bool = False,
    decoding: BlockDecoding | None = None,
) -> tuple[Path, Path | None]:
    """A trace of ``checkpoint`` (a local ``transformers`` checkpoint folder) decoding ``prompts``, autoregressively
    or, with ``decoding``, by blocks (:func:`record_block_diffusion`); returns the trace and the model file written
    beside it (None with ``shape``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    topo = topology_of(model, name=Path(checkpoint).name)
    mode = "autoregressive" if decoding is None else "block-diffusion"
    out = Path(out)
    if shape:
        real = find_model(shape).topology
        for f in ("n_experts", "top_k", "moe_layers"):
            if getattr(real, f) != getattr(topo, f):
                raise TraceError(
                    f"--shape {shape}: the checkpoint's {f} is {getattr(topo, f)}, {shape} has {getattr(real, f)}"
                )
        model_ref, model_file = shape, None
    else:
        model_file = out.with_name(out.name + ".model.yaml")
        model_file.write_text(
            model_file_text(
                topo,
                decoding=mode,
                source=f"{Path(checkpoint).resolve()}/config.json",
                router=f"{topo.n_experts} experts, top-{topo.top_k} (recorded from the checkpoint's router)",
                attention=f"{topo.n_heads} query heads, {topo.n_kv_heads} key/value heads",
            )
        )
        model_ref = str(model_file)
    log = out.with_name(out.name + ".routing.jsonl")
    block = 1 if decoding is None else decoding.block_length
    header = InterchangeHeader(model_ref, mode, block, dataset="prompts", engine="transformers")
    with InterchangeWriter(log, header) as w:
        if decoding is None:
            record_autoregressive(model, prompts, max_new_tokens, w, topo.top_k)
        else:
            record_block_diffusion(model, prompts, max_new_tokens, decoding, w, topo.top_k)
    return import_trace(log, out, overwrite=overwrite), model_file


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-trace-record-hf",
        description="Record a routing trace from a local Hugging Face transformers MoE checkpoint decoding prompts "
        "autoregressively or by blocks, as a block-diffusion model decodes (forward hooks on every router).",
        formatter_class=HelpFormatter,
        epilog="Examples: dllm-trace-record-hf --checkpoint ckpt/olmoe-tiny --random-prompts 4 --out traces_out/olmoe\n"
        "  dllm-trace-record-hf --checkpoint ckpt/llada-moe --decoding block-diffusion --block-length 32 "
        "--random-prompts 4 --out traces_out/llada_moe",
    )
    p.add_argument(
        "--checkpoint", required=True, help="a local transformers checkpoint folder (config.json, weights)"
    )
    p.add_argument("--out", required=True, help="the trace directory to write")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument(
        "--prompts", help="a text file of prompts as token ids, one prompt per line (space-separated)"
    )
    g.add_argument(
        "--random-prompts", type=positive_int, help="this many prompts of random token ids (a smoke run)"
    )
    p.add_argument(
        "--prompt-len", type=positive_int, default=16, help="tokens per random prompt (default 16)"
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=32, help="tokens decoded per prompt (default 32)"
    )
    p.add_argument(
        "--shape", default=None, help="record under this catalogue model's sizes (its routing must match)"
    )
    p.add_argument(
        "--decoding",
        choices=("autoregressive", "block-diffusion"),
        default="autoregressive",
        help="one token per forward with a KV cache, or blocks of masked tokens denoised and committed (default "
        "autoregressive)",
    )
    p.add_argument(
        "--block-length", type=positive_int, default=32, help="block-diffusion: tokens per block (default 32)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.9,
        help="block-diffusion: a masked position is decoded once its confidence reaches this (default 0.9)",
    )
    p.add_argument(
        "--mask-token-id",
        type=int,
        default=None,
        help="block-diffusion: the mask token (default: the checkpoint's mask_token_id)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--overwrite", action="store_true", help="replace a trace this project wrote at --out")
    args = p.parse_args(argv)
    try:
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(args.checkpoint).vocab_size
        if args.prompts:
            prompts = [
                [int(x) for x in ln.split()]
                for ln in Path(args.prompts).read_text().splitlines()
                if ln.strip()
            ]
        else:
            rng = np.random.default_rng(args.seed)
            prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.random_prompts)]
        decoding = None
        if args.decoding == "block-diffusion":
            mask = args.mask_token_id
            if mask is None:
                mask = getattr(AutoConfig.from_pretrained(args.checkpoint), "mask_token_id", None)
            if mask is None:
                raise ValueError(
                    f"{args.checkpoint}/config.json has no mask_token_id; --decoding block-diffusion needs "
                    f"--mask-token-id"
                )
            if not 0 <= mask < vocab:
                raise ValueError(f"--mask-token-id {mask} is not a token of the vocabulary (0..{vocab - 1})")
            if not 0 < args.threshold <= 1:
                raise ValueError(f"--threshold {args.threshold} must be in (0, 1]")
            decoding = BlockDecoding(args.block_length, int(mask), args.threshold)
        trace, model_file = record_trace(
            args.checkpoint, prompts, args.max_new_tokens, args.out, args.shape, args.overwrite, decoding
        )
    except (TraceError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {trace}" + (f" and its model file {model_file}" if model_file else ""))
    return 0


cli = entry_point(main)  # console entry point ``dllm-trace-record-hf``


if __name__ == "__main__":
    cli()
