"""The synthetic traces the paper's figure experiments read (``conf/experiment/fig*.yaml``, under ``fig_traces``):
``<model>_b16``, ``mini_batch`` and ``mini_block<B>``, made by ``dllm-synth --figure-traces DIR`` (and by
``notebooks/figures.py``). Deterministic; an existing trace made with the same settings is kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dllm_offload_sim.traces.shipped import SYNTHETIC_TRACE, shipped_trace_path
from dllm_offload_sim.traces.synth import calibrated_config, write_synthetic_trace

BLOCKS = [1, 2, 4, 8, 16, 32, 64]  # the block lengths of Fig. 16b's traces
DEFAULT_DIR = "outputs/fig_traces"  # where the experiments look, unless DLLM_FIG_TRACES names another folder


def make_figure_traces(tdir: Path, quick: bool = False) -> dict:
    """The traces the experiments read: <model>_b16, mini_batch, mini_block<B>. Deterministic; kept
    between runs (an existing trace is reused)."""
    tdir.mkdir(parents=True, exist_ok=True)
    made = {}

    def synth(name, calibration="paper-mini", **kw):
        p = tdir / name
        cfg = calibrated_config(calibration, **kw)
        meta = p / "meta.json"
        if not meta.is_file() or json.loads(meta.read_text()).get("extra", {}).get(
            "generator"
        ) != dataclasses.asdict(cfg):
            write_synthetic_trace(cfg, p, overwrite=True)  # absent, or made with other settings: (re)made
        made[name] = p

    if quick:
        synth("mini_b16", model="mini", n_requests=2, max_new_tokens=48, seed=0)
        synth("mini_batch", model="mini", n_requests=4, max_new_tokens=32, seed=1)
        for b in (1, 4, 16):
            synth(f"mini_block{b}", model="mini", n_requests=1, max_new_tokens=32, block_length=b, seed=2)
    else:
        link = tdir / "mini_b16"
        if link.is_symlink() and link.resolve() != shipped_trace_path(SYNTHETIC_TRACE).resolve():
            link.unlink()  # a link to where a moved checkout (or an older layout) kept the shipped trace
        if not link.exists():
            link.symlink_to(shipped_trace_path(SYNTHETIC_TRACE))
        made["mini_b16"] = link
        synth("flash_b16", "paper-flash", model="flash", n_requests=4, max_new_tokens=256, seed=0)
        synth("mini_batch", model="mini", n_requests=32, max_new_tokens=64, seed=1)
        for b in BLOCKS:
            synth(f"mini_block{b}", model="mini", n_requests=2, max_new_tokens=128, block_length=b, seed=2)
    return made
