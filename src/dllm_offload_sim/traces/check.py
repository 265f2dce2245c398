"""``dllm-trace-check TRACE``: validate a whole trace, whoever wrote it, and say what it holds.

Opens the trace (``meta.json``, the three tables' files and columns), then reads and checks every request as the
simulator would (:meth:`Trace.request`: contiguous steps, known phases, layer ids that are MoE layers, top-k lists of
distinct in-range experts, finite weights, each routing and token row exactly once, confidence in [0, 1] or NaN).
A request's problem does not stop the check: every request with one is listed, each problem naming the file, the
column and the row. A trace without problems gets the workload summary ``dllm-stats`` prints. Exit status: 0 clean,
1 problems found, 2 the trace could not be opened at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.shipped import resolve_trace
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point


@dataclass(frozen=True)
class RequestProblem:
    """The first problem of one request: the request, the file, column and row it is at, and the message."""

    request_id: int
    file: str
    column: str | None
    row: int | None
    message: str


@dataclass(frozen=True)
class CheckReport:
    """What ``check_trace`` found: the trace's shape and size, and each request's problem (empty: clean)."""

    path: str
    model: str
    n_requests: int
    n_forwards: int
    n_routing_rows: int
    problems: tuple[RequestProblem, ...]


def check_trace(trace: Trace) -> CheckReport:
    """Every request of ``trace`` read and checked; a request that fails is recorded and the next one read."""
    problems, forwards, rows = [], 0, 0
    for rid in trace.request_ids:
        try:
            req = trace.request(rid)
        except TraceError as e:
            problems.append(
                RequestProblem(
                    rid,
                    getattr(e, "file", str(trace.path)),
                    getattr(e, "column", None),
                    getattr(e, "row", None),
                    str(e),
                )
            )
            continue
        forwards += len(req.phase)
        rows += int(req.row_offset[-1]) * trace.topology.n_moe_layers
    return CheckReport(
        str(trace.path), trace.topology.name, len(trace.request_ids), forwards, rows, tuple(problems)
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-trace-check",
        description=__doc__.split("\n\n")[1],
        formatter_class=HelpFormatter,
        epilog="Example: dllm-trace-check traces_out/mine      dllm-trace-check synthetic_mini_b16 --json",
    )
    p.add_argument("trace", help="a trace directory or a shipped trace's name")
    p.add_argument("--json", action="store_true", help="print the report (and the summary) as JSON")
    p.add_argument("--no-stats", action="store_true", help="check only; skip the workload summary")
    args = p.parse_args(argv)
    try:
        trace = Trace.open(resolve_trace(args.trace))
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = check_trace(trace)
    stats = None
    if not report.problems and not args.no_stats:
        from dllm_offload_sim.traces.analytics import compute_stats

        stats = compute_stats(trace, None, progress=False)
    summary = stats.summary if stats is not None else None
    if args.json:
        print(json.dumps({**asdict(report), "summary": summary}, indent=1, default=str))
    else:
        print(
            f"{report.path}: {report.model}, {report.n_requests} requests, {report.n_forwards} forwards, "
            f"{report.n_routing_rows} routing rows checked"
        )
        for pr in report.problems:
            print(f"  request {pr.request_id}: {pr.message}")
        if report.problems:
            print(
                f"{len(report.problems)} of {report.n_requests} requests have a problem (the first of each)"
            )
        else:
            print("no problems")
            if stats is not None:
                from dllm_offload_sim.traces.stats import format_summary

                print(format_summary(stats))
    return 1 if report.problems else 0


cli = entry_point(main)  # console entry point ``dllm-trace-check``


if __name__ == "__main__":
    cli()
