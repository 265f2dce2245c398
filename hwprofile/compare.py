"""``python -m hwprofile.compare A B``: how far apart two profiles' curves are (reproducibility check)."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from hwprofile.profile import CURVES_1D, CURVES_2D, load_profile


def curve_differences(a, b) -> dict:
    """Per curve: the largest relative difference |a - b| / min(a, b) over common points."""
    out = {"h2d": float(np.max(np.abs(np.subtract(a.h2d["seconds"], b.h2d["seconds"])) /
                                np.minimum(a.h2d["seconds"], b.h2d["seconds"])))}
    for name in (*CURVES_1D, *CURVES_2D):
        x, y = np.asarray(a.curves[name]["seconds"], float), np.asarray(b.curves[name]["seconds"], float)
        if x.shape != y.shape:
            raise ValueError(f"curve {name}: grids differ ({x.shape} vs {y.shape})")
        out[name] = float(np.max(np.abs(x - y) / np.maximum(np.minimum(x, y), 1e-12)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hwprofile.compare", description=__doc__)
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tolerance", type=float, default=0.05, help="allowed relative difference (default 0.05)")
    args = p.parse_args(argv)
    d = curve_differences(load_profile(args.a), load_profile(args.b))
    for k, v in d.items():
        print(f"{k:14s} max relative difference {100 * v:6.2f}%  {'ok' if v <= args.tolerance else 'OVER'}")
    return 0 if all(v <= args.tolerance for v in d.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
