"""``dllm-profile-merge A B [C ...] --out M``: one profile from several profiling runs.

On a shared host one profiling run is one sample: the host-bound curves and the runtime's per-layer
terms move between runs by more than the simulator's error budget (docs/cost-model.md).
The merge takes, point by point, the median of every curve over the runs (H2D, grouped GPU calls and
their kernels, CPU expert and its call overhead, CPU dispatch, non-expert, dense, per-forward), and
the median of each ``runtime`` term over the runs that measured it; it refuses runs of another
model shape, dtype, GPU, curve grid or CPU expert thread count, naming the file and field. The
result is stamped with the first run's machine, the median kernel-launch time, the median of the host
memory bandwidths the runs' CPU curves were timed at (``cpu_expert.mem_gbps``, where every run has one),
and the runs it came from (``stamp.merged_from``, ``notes``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import numpy as np

from dllm_offload_sim.costmodel.profile import (
    CURVES_1D,
    CURVES_2D,
    DEFAULT_COPIES_PER_EXPERT,
    DEFAULT_CPU_ORDERING,
    OPTIONAL_2D,
    RUNTIME_FIELDS,
    SHAPE_FIELDS,
    HardwareProfile,
    ProfileError,
    curve_axes,
    load_profile,
)
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point

MUST_AGREE = (
    "gpu",
    "dtype",
    "cpu_model",
    "host",
)  # stamp fields that make two runs measurements of the same thing


def _shown(path: str) -> str:
    """A run's path as recorded: relative to the working directory where it lies under it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def merge_profiles(profiles: list[HardwareProfile], name: str | None = None) -> HardwareProfile:
    """The point-wise median of ``profiles`` (module docstring); at least two, of one shape and grid."""
    if len(profiles) < 2:
        raise ValueError(f"merge needs at least two profiles, got {len(profiles)}")
    paths = [str(Path(p.path).resolve()) if p.path else None for p in profiles]
    dup = next((p for i, p in enumerate(paths) if p is not None and p in paths[:i]), None)
    if dup is not None:  # one run counted twice would weigh its numbers double
        raise ProfileError(dup, "<file>", "given more than once; each run counts once in the median")
    first = profiles[0]
    for p in profiles[1:]:
        for f in SHAPE_FIELDS:
            if p.model_shape.get(f) != first.model_shape.get(f):
                raise ProfileError(
                    p.path,
                    f"model_shape.{f}",
                    f"is {p.model_shape.get(f)!r}, but {first.model_shape.get(f)!r} in {first.path}",
                )
        for f in MUST_AGREE:
            if p.stamp.get(f) != first.stamp.get(f):
                raise ProfileError(
                    p.path, f"stamp.{f}", f"is {p.stamp.get(f)!r}, but {first.stamp.get(f)!r} in {first.path}"
                )
        cpe = (
            p.h2d.get("copies_per_expert", DEFAULT_COPIES_PER_EXPERT),
            first.h2d.get("copies_per_expert", DEFAULT_COPIES_PER_EXPERT),
        )
        if cpe[0] != cpe[1]:
            raise ProfileError(
                p.path,
                "h2d.copies_per_expert",
                f"is {cpe[0]}, but {cpe[1]} in {first.path} (runtimes that copy an expert differently)",
            )
        # CPU curves of another engine or another thread count are different curves
        for f, default in (("engine", "torch"), ("threads", None), ("ordering", DEFAULT_CPU_ORDERING)):
            v, v0 = p.curves["cpu_expert"].get(f, default), first.curves["cpu_expert"].get(f, default)
            if v != v0:
                raise ProfileError(
                    p.path,
                    f"cpu_expert.{f}",
                    f"is {v!r}, but {v0!r} in {first.path} "
                    f"(CPU curves of different {f}s are different curves)",
                )
    out = copy.deepcopy(first)
    for curve in ("h2d", *CURVES_1D, *CURVES_2D, *OPTIONAL_2D):
        src = [p.h2d if curve == "h2d" else p.curves.get(curve) for p in profiles]
        if curve in OPTIONAL_2D and any(s is None for s in src):
            out.curves.pop(curve, None)  # only where every run measured it
            continue
        for p, s in zip(profiles[1:], src[1:]):
            for ax in curve_axes(curve):
                if list(s[ax]) != list(src[0][ax]):
                    raise ProfileError(
                        p.path, f"{curve}.{ax}", f"grid {list(s[ax])} differs from {first.path}'s"
                    )
        med = np.median(np.stack([np.asarray(s["seconds"], float) for s in src]), axis=0).tolist()
        (out.h2d if curve == "h2d" else out.curves[curve])["seconds"] = med
    out.curves["cpu_expert"]["call_overhead_s"] = float(
        statistics.median(p.curves["cpu_expert"].get("call_overhead_s", 0.0) for p in profiles)
    )
    bands = [p.curves["cpu_expert"].get("bands") for p in profiles]
    out.curves["cpu_expert"].pop("bands", None)
    if (
        all(bands) and len({tuple(b["after"] for b in bs) for bs in bands}) == 1
    ):  # only where every run measured them
        out.curves["cpu_expert"]["bands"] = [
            {
                "after": b0["after"],
                "seconds": np.median(
                    np.stack([np.asarray(bs[i]["seconds"], float) for bs in bands]), axis=0
                ).tolist(),
            }
            for i, b0 in enumerate(bands[0])
        ]
    out.curves["cpu_expert"].pop("calls", None)  # the timed calls of one run, not of the merge
    gbps = [p.cpu_curve_gbps() for p in profiles]  # the median curve's host bandwidth: the runs' median
    out.curves["cpu_expert"].pop("mem_gbps", None)
    if all(g is not None for g in gbps):
        out.curves["cpu_expert"]["mem_gbps"] = [round(float(statistics.median(gbps)), 2)]
    runtime = {}
    for f in RUNTIME_FIELDS:
        vals = [p.runtime[f] for p in profiles if p.runtime and f in p.runtime]
        if vals:
            runtime[f] = float(statistics.median(vals))
    out.runtime = runtime or None
    launches = [p.stamp["host_launch_us"] for p in profiles if "host_launch_us" in p.stamp]
    out.stamp = {**first.stamp, "merged_from": [_shown(p.path) for p in profiles]}
    if launches:
        out.stamp["host_launch_us"] = round(float(statistics.median(launches)), 3)
    out.name = name or first.name
    out.status = "measured"
    out.notes = f"point-wise median of {len(profiles)} profiling runs (dllm-profile-merge): " + ", ".join(
        Path(p.path).name for p in profiles
    )
    out.path = ""
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="dllm-profile-merge",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-profile-merge run1.json run2.json run3.json "
        "--name h200-mini --out costmodel/profiles/h200-mini.merged.json",
    )
    ap.add_argument(
        "profiles", nargs="+", help="profile files (or shipped names) of one machine and model shape"
    )
    ap.add_argument("--out", required=True, help="where to write the merged profile")
    ap.add_argument("--name", help="the merged profile's name (default: the first run's)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    a = ap.parse_args(argv)
    if Path(a.out).exists() and not a.overwrite:
        print(
            f"error: {a.out}: already exists; refusing to write over it (pass --overwrite to replace it)",
            file=sys.stderr,
        )
        return 2
    try:
        merged = merge_profiles([load_profile(p) for p in a.profiles], name=a.name)
        merged.save(a.out)
    except (ProfileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out} (median of {len(a.profiles)} runs)")
    return 0


cli = entry_point(main)  # console entry point ``dllm-profile-merge``


if __name__ == "__main__":
    cli()
