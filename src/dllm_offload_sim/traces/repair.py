"""``dllm-repair TRACE``: bring a trace collected by an older collector up to the format.

One repair: the ``confidence`` of prompt rows is NaN (``docs/trace-format.md``). A collector before this
rule recorded the model's output confidence on the prompt rows that share the first decode block with the
generated ones (when the prompt length is not a multiple of the block length); policies that read the
previous forward's confidence (OLED-MoE) would treat those rows as decoded tokens. The repair sets them to
NaN and changes nothing else. It writes a new trace (``--out``), or replaces the trace in place with
``--in-place`` once the repaired copy is complete.

Example::

    dllm-repair traces/data/llada2_small_humaneval_b16 --in-place
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from dllm_offload_sim.traces.cli import HelpFormatter, entry_point
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import PREFILL, RequestArrays
from dllm_offload_sim.traces.subset import subset_trace


def prompt_rows(req: RequestArrays) -> np.ndarray:
    """[rows] bool: the rows of decode forwards that sit at prompt positions (row r of a forward starting at
    position ``kv_len`` is at ``kv_len + r``)."""
    out = np.zeros(req.confidence.shape[0], bool)
    for s in range(req.n_steps):
        if req.phase[s] == PREFILL:
            continue
        lo, hi = int(req.row_offset[s]), int(req.row_offset[s + 1])
        pos = int(req.kv_len[s]) + np.arange(hi - lo)
        out[lo:hi] = pos < req.prompt_len
    return out


def null_prompt_confidence(req: RequestArrays) -> RequestArrays:
    """``req`` with NaN confidence on its prompt rows."""
    conf = req.confidence.copy()
    conf[prompt_rows(req)] = np.nan
    return dataclasses.replace(req, confidence=conf)


def count_prompt_confidence(trace: Trace) -> int:
    """How many prompt rows of ``trace`` carry a confidence (0 for a trace that follows the format)."""
    n = 0
    for rid in trace.request_ids:
        req = trace.request(rid)
        n += int(np.isfinite(req.confidence[prompt_rows(req)]).sum())
    return n


def repair_trace(src, out=None, in_place: bool = False):
    """Repair ``src`` into ``out`` (or in place); returns (path, rows repaired)."""
    tr = Trace.open(src)
    n = count_prompt_confidence(tr)
    path = subset_trace(
        src,
        src if in_place else out,
        tr.request_ids,
        overwrite=in_place,
        transform=null_prompt_confidence,
        note="repaired_from",
        extra={"repair": {"prompt_rows_confidence_nulled": n}},
    )
    return path, n


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dllm-repair", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("trace", help="trace directory to repair")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the repaired trace here (a new directory)")
    g.add_argument(
        "--in-place", action="store_true", help="replace the trace once the repaired copy is complete"
    )
    a = p.parse_args(argv)
    path, n = repair_trace(a.trace, a.out, a.in_place)
    print(f"wrote {path}: confidence of {n} prompt rows set to NaN")
    return 0


cli = entry_point(main)  # console entry point ``dllm-repair``


if __name__ == "__main__":
    cli()
