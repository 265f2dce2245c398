"""``dllm-subset``: copy some requests of a trace into a new trace directory.

Keeps the requests' routing, confidence and step records unchanged and the source meta (model,
decoding, dataset, source); notes which trace and requests it came from under ``extra.subset_of``.
Used to cut a long collection down to the shipped size, or to pick requests for a quick experiment.

Example::

    dllm-subset /tmp/rt/traces/humaneval_b16 traces/data/llada2_small_humaneval_b16 --first 6
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.writer import write_trace
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point


def subset_trace(
    src,
    out,
    request_ids,
    extra: dict | None = None,
    overwrite: bool = False,
    transform=None,
    note: str = "subset_of",
) -> Path:
    """Write the requests ``request_ids`` of trace ``src`` (in that order) as a new trace at ``out``, each
    passed through ``transform`` (a request -> request function) where one is given; ``extra[note]`` records
    where they came from. ``out`` may be ``src`` itself with ``overwrite`` (replaced once the copy is complete)."""
    tr = Trace.open(src)
    have = set(tr.request_ids)
    missing = [r for r in request_ids if r not in have]
    if missing:
        raise TraceError(f"{src}: no request_id {missing[0]} (the trace holds {sorted(have)})")
    meta = tr.meta
    info = dict(meta.get("extra") or {})
    info.update(extra or {})
    info[note] = {"trace": str(src), "n_requests": len(have), "request_ids": [int(r) for r in request_ids]}
    reqs = (tr.request(r) for r in request_ids)
    if transform is not None:
        reqs = map(transform, reqs)
    return write_trace(
        out,
        tr.topology,
        reqs,
        source=meta["source"],
        decoding=meta["decoding"],
        dataset=meta.get("dataset", ""),
        extra=info,
        overwrite=overwrite,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dllm-subset", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("src", help="trace directory to read")
    p.add_argument("out", help="trace directory to create")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--first", type=int, help="the first N requests (in request_id order)")
    g.add_argument("--requests", type=int, nargs="+", help="these request ids")
    p.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add KEY: VALUE to the meta's 'extra' (repeatable)",
    )
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    try:
        extra = {}
        for kv in a.note:
            if "=" not in kv:
                p.error(f"--note {kv!r}: expected KEY=VALUE")
            k, v = kv.split("=", 1)
            extra[k] = v
        ids = a.requests
        if ids is None:
            if a.first < 1:
                p.error(f"--first must be >= 1, got {a.first}")
            ids = sorted(Trace.open(a.src).request_ids)[: a.first]
        out = subset_trace(a.src, a.out, ids, extra, a.overwrite)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(ids)} requests)")
    return 0


cli = entry_point(main)  # console entry point ``dllm-subset``


if __name__ == "__main__":
    cli()
