"""``python -m hwprofile.compare A B``: how far apart two profiles' curves are (reproducibility check).

With ``--envelope`` each curve is first replaced by its monotone lower envelope (every point the
minimum over the points that do at least as much work: more tokens, experts or KV never cost less),
which removes isolated upward spikes of single points, as host-bound timings on a shared VM show.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hwprofile.profile import CURVES_1D, CURVES_2D, load_profile


def monotone_envelope(seconds) -> np.ndarray:
    """Each point replaced by the minimum over the points at least as large on every axis (1-D or 2-D)."""
    y = np.asarray(seconds, float)
    if y.ndim == 1:
        return np.minimum.accumulate(y[::-1])[::-1]
    if y.ndim != 2:
        raise ValueError(f"curve of {y.ndim} dimensions; expected 1 or 2")
    y = np.minimum.accumulate(y[::-1], axis=0)[::-1]
    return np.minimum.accumulate(y[:, ::-1], axis=1)[:, ::-1]


def _rel(x, y) -> float:
    return float(np.max(np.abs(x - y) / np.maximum(np.minimum(x, y), 1e-12)))


def curve_differences(a, b, envelope: bool = False) -> dict:
    """Per curve: the largest relative difference |a - b| / min(a, b) over common points."""
    fit = monotone_envelope if envelope else (lambda s: np.asarray(s, float))
    out = {"h2d": _rel(fit(a.h2d["seconds"]), fit(b.h2d["seconds"]))}
    for name in (*CURVES_1D, *CURVES_2D):
        x, y = fit(a.curves[name]["seconds"]), fit(b.curves[name]["seconds"])
        if x.shape != y.shape:
            raise ValueError(f"curve {name}: grids differ ({x.shape} vs {y.shape})")
        out[name] = _rel(x, y)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hwprofile.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Example: python -m hwprofile.compare hwprofile/profiles/h200-mini.measured.json "
                                       "hwprofile/profiles/repro/h200-mini.2026-12-03-sweep.json --envelope")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed relative difference (default 0.05)")
    p.add_argument("--envelope", action="store_true", help="compare the curves' monotone lower envelopes")
    args = p.parse_args(argv)
    d = curve_differences(load_profile(args.a), load_profile(args.b), envelope=args.envelope)
    for k, v in d.items():
        print(f"{k:14s} max relative difference {100 * v:6.2f}%  {'ok' if v <= args.tolerance else 'OVER'}")
    return 0 if all(v <= args.tolerance for v in d.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
