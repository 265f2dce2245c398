"""``dllm-reproduce``: the paper's claims beside ours, along a ladder of factors from the paper's setup to ours.

Runs every simulation the ladder (:mod:`.setups`) and the trace-property sweeps (:mod:`.sensitivity`) need, keeping
each finished run under ``--work`` (an interrupted command resumes where it stopped), then writes REPRODUCTION.md,
its CSVs and figures into ``--out`` (:mod:`.report`). ``--quick`` runs the same ladder on short mini traces in about
a minute (a first look; the committed REPRODUCTION.md is the full run's).
"""

from __future__ import annotations

import argparse
import sys
import time

from dllm_offload_sim.reproduce.jobs import default_workers, run_jobs
from dllm_offload_sim.reproduce.report import write_report
from dllm_offload_sim.reproduce.sensitivity import sweep_jobs, sweep_traces
from dllm_offload_sim.reproduce.setups import Plan, ladder
from dllm_offload_sim.traces.atomic import output_folder
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point, positive_int


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dllm-reproduce",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Examples:\n  dllm-reproduce                      # the full ladder into reproduction/\n"
        "  dllm-reproduce --quick --out /tmp/r # short traces, mini only\n"
        "  dllm-reproduce --jobs 8             # more worker processes (results do not depend on it)",
    )
    p.add_argument(
        "--out",
        default="reproduction",
        help="folder for REPRODUCTION.md, its CSVs and figures (default: reproduction/)",
    )
    p.add_argument(
        "--work",
        default=None,
        help="folder for the traces and finished runs (default: OUT/_work); "
        "a rerun into the same folder runs only what is missing",
    )
    p.add_argument(
        "--quick", action="store_true", help="short mini traces, a few capacities (about a minute)"
    )
    p.add_argument(
        "--jobs", type=positive_int, default=None, help="worker processes (default: one per CPU core)"
    )
    p.add_argument("--no-sensitivity", action="store_true", help="skip the trace-property sweeps")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from tqdm import tqdm

    t0 = time.time()
    out = output_folder(args.out, "reproduction")
    work = output_folder(args.work or out / "_work", "reproduction's runs")
    setups = ladder()
    plan = Plan.quick(setups) if args.quick else Plan(setups)
    traces = (
        []
        if args.no_sensitivity
        else (sweep_traces(128, 2, points=(0, 2, 4)) if args.quick else sweep_traces())
    )
    sens_jobs = sweep_jobs(traces)
    jobs = plan.unique_jobs()
    seen = set(jobs)
    jobs += [j for j in sens_jobs if j not in seen]
    workers = args.jobs or default_workers()
    with tqdm(total=len(jobs), desc="reproduce", unit="run") as bar:
        ran = run_jobs(jobs, work, workers, progress=bar.update)
    cmd = (
        "dllm-reproduce"
        + (" --quick" if args.quick else "")
        + (" --no-sensitivity" if args.no_sensitivity else "")
    )
    written = write_report(plan, work, out, cmd, traces, sens_jobs, quick=args.quick)
    print(
        f"{len(jobs)} runs ({ran} new, {len(jobs) - ran} resumed) with {workers} workers; wrote "
        f"{len(written)} files to {out} in {time.time() - t0:.0f} s"
    )
    return 0


cli = entry_point(main)  # console entry point ``dllm-reproduce``


if __name__ == "__main__":
    sys.exit(cli())
