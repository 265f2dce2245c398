"""``dllm-profile-compare A B``: how far apart two profiles' curves are (reproducibility check).

With ``--envelope`` each curve is first replaced by its monotone lower envelope (every point the
minimum over the points that do at least as much work: more tokens, experts or KV never cost less),
which removes isolated upward spikes of single points, as host-bound timings on a shared VM show.
Each line also gives the median difference over the curve's points and where the maximum is (e.g.
``h2d ... max at bytes 1 MiB: 22.7 vs 27.5 us``), so a single latency-bound point and a moved level read
differently.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from dllm_offload_sim.costmodel.cost_model import fit_h2d
from dllm_offload_sim.costmodel.profile import (
    CURVES_1D,
    CURVES_2D,
    OPTIONAL_2D,
    ProfileError,
    curve_axes,
    load_profile,
)
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point, non_negative_float


def monotone_envelope(seconds) -> np.ndarray:
    """Each point replaced by the minimum over the points at least as large on every axis (1-D or 2-D)."""
    y = np.asarray(seconds, float)
    if y.ndim == 1:
        return np.minimum.accumulate(y[::-1])[::-1]
    if y.ndim != 2:
        raise ValueError(f"curve of {y.ndim} dimensions; expected 1 or 2")
    y = np.minimum.accumulate(y[::-1], axis=0)[::-1]
    return np.minimum.accumulate(y[:, ::-1], axis=1)[:, ::-1]


def _rel(x, y) -> np.ndarray:
    return np.abs(x - y) / np.maximum(np.minimum(x, y), 1e-12)


def _axes(profile, name: str) -> tuple:
    """The names and values of a curve's axes."""
    src = profile.h2d if name == "h2d" else profile.curves[name]
    return tuple((k, src[k]) for k in curve_axes(name))


def _fitted_h2d(p) -> np.ndarray:
    """The H2D line the cost model uses (``fit_h2d``: latency + bytes / bandwidth) at the measured sizes."""
    lat, bw = fit_h2d(p.h2d["bytes"], p.h2d["seconds"])
    return lat + np.asarray(p.h2d["bytes"], float) / bw


def curve_report(a, b, envelope: bool = False) -> dict:
    """Per curve: the largest relative difference |a - b| / min(a, b) over common points, where it is
    (the point's axis values), and the median over the points (one spiky point vs a moved level).

    ``h2d_fit`` is the fitted line the simulator uses for copies (the raw ``h2d`` points are only its
    input); ``gpu_experts_device`` (grouped kernels alone) is included where both profiles have it."""
    fit = monotone_envelope if envelope else (lambda s: np.asarray(s, float))
    names = ["h2d", "h2d_fit", *CURVES_1D, *CURVES_2D]
    names += [k for k in OPTIONAL_2D if k in a.curves and k in b.curves]
    out = {}
    for name in names:
        if name == "h2d_fit":
            x, y = _fitted_h2d(a), _fitted_h2d(b)
        else:
            src = (lambda p: p.h2d) if name == "h2d" else (lambda p: p.curves[name])
            x, y = fit(src(a)["seconds"]), fit(src(b)["seconds"])
        if x.shape != y.shape:
            raise ValueError(f"curve {name}: grids differ ({x.shape} vs {y.shape})")
        r = _rel(x, y)
        at = np.unravel_index(int(np.argmax(r)), r.shape)
        where = {k: v[i] for (k, v), i in zip(_axes(a, name.removesuffix("_fit")), at)}
        out[name] = {
            "max": float(r.max()),
            "median": float(np.median(r)),
            "at": where,
            "a_s": float(x[at]),
            "b_s": float(y[at]),
        }
    return out


def curve_differences(a, b, envelope: bool = False) -> dict:
    """Per curve: the largest relative difference |a - b| / min(a, b) over common points."""
    return {k: v["max"] for k, v in curve_report(a, b, envelope).items()}


def probe_lines(a, b) -> list[str]:
    """The two profiles' host probes (``profiler.host_probe``) side by side, where both have them: did
    the host itself move between the runs?"""
    pa, pb = a.stamp.get("host_probe"), b.stamp.get("host_probe")
    if not pa or not pb:
        return []
    out = []
    for when in ("before", "after"):
        for k in ("ref_expert_1tok_us", "ref_expert_8tok_us", "mem_gbps", "loadavg_1m"):
            x, y = pa.get(when, {}).get(k), pb.get(when, {}).get(k)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                rel = f"{100 * abs(x - y) / min(x, y):6.2f}%" if min(x, y) > 0 else "     -"
                out.append(f"host {when:6s} {k:18s} {x:9.2f} vs {y:9.2f}  {rel}")
    for k in ("steal_frac", "cpu_expert_steal_frac"):
        x, y = pa.get(k), pb.get(k)
        if x is not None and y is not None:
            out.append(f"host steal {k:21s} {100 * x:6.2f}% vs {100 * y:6.2f}%")
    return out


def _point(at: dict) -> str:
    return ", ".join(f"{k} {v / 2**20:g} MiB" if k == "bytes" else f"{k} {v}" for k, v in at.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-profile-compare",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-profile-compare costmodel/profiles/h200-mini.measured.json "
        "validation/h200/profile-repro/mini_b.json --envelope",
    )
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument(
        "--tolerance",
        type=non_negative_float,
        default=0.05,
        help="allowed relative difference, >= 0 (default 0.05)",
    )
    p.add_argument("--envelope", action="store_true", help="compare the curves' monotone lower envelopes")
    args = p.parse_args(argv)
    try:
        a, b = load_profile(args.a), load_profile(args.b)
        d = curve_report(a, b, envelope=args.envelope)
    except (ProfileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in probe_lines(a, b):
        print(line)
    for k, v in d.items():
        print(
            f"{k:18s} max relative difference {100 * v['max']:6.2f}%  {'ok' if v['max'] <= args.tolerance else 'OVER'}"
            f"  (median {100 * v['median']:5.2f}%; max at {_point(v['at'])}: {1e6 * v['a_s']:.1f} vs "
            f"{1e6 * v['b_s']:.1f} us)"
        )
    return 0 if all(v["max"] <= args.tolerance for v in d.values()) else 1


cli = entry_point(main)  # console entry point ``dllm-profile-compare``


if __name__ == "__main__":
    cli()
