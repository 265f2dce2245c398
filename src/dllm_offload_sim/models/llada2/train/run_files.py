"""What a training run writes besides its log and checkpoint: decoded samples and the loss curve."""

from __future__ import annotations

import io
import time
from pathlib import Path

from dllm_offload_sim.models.llada2.decode import generate
from dllm_offload_sim.models.llada2.train.corpus import decode, encode
from dllm_offload_sim.traces.atomic import atomic_savefig, atomic_write_text


def write_samples(model, path: Path, prompts: list[str], max_new: int, block: int) -> list[dict]:
    """Decode each prompt (threshold 0.9) and write them as Markdown; returns the records."""
    model.eval()
    recs = []
    for p in prompts:
        forwards = []
        t0 = time.perf_counter()
        out = generate(model, encode(p), max_new, block, 0.9, on_forward=forwards.append)
        recs.append(
            {
                "prompt": p,
                "completion": decode(out),
                "tokens": len(out),
                "forwards": len(forwards),
                "seconds": round(time.perf_counter() - t0, 3),
            }
        )
    md = io.StringIO()
    for r in recs:
        md.write(
            f"### Prompt\n```\n{r['prompt']}\n```\n**Completion** ({r['tokens']} tokens, {r['forwards']} "
            f"forwards):\n```\n{r['completion']}\n```\n\n"
        )
    atomic_write_text(path, md.getvalue())
    return recs


def plot_loss(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    tr = [r for r in rows if r.get("train_loss") not in ("", None)]
    va = [r for r in rows if r.get("val_loss") not in ("", None)]
    ax.plot([r["step"] for r in tr], [r["train_loss"] for r in tr], lw=1, label="train (ELBO)")
    ax.plot([r["step"] for r in va], [r["val_loss"] for r in va], "o-", ms=3, label="held-out (ELBO)")
    ar = [r["step"] for r in rows if r.get("block") == 1]
    if ar:  # the training loss is the autoregressive one up to here; the held-out loss is block diffusion's
        ax.axvline(max(ar), color="grey", ls=":", lw=1, label="autoregressive until here")
    ax.set_xlabel("step")
    ax.set_ylabel("masked block-diffusion loss (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=120)
    plt.close(fig)
