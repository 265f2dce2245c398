"""Sweep launchers at scale: a 1,000-configuration sweep through joblib or Ray on this machine.

    python bench/bench_launchers.py --launcher local --layout jobs     # 1,000 jobs of one simulation each
    python bench/bench_launchers.py --launcher ray --layout jobs
    python bench/bench_launchers.py --launcher local --layout tables   # 10 jobs of a 100-run table each

The configurations: 10 policies x 10 caches x 10 PCIe bandwidths on request 0 of the shipped synthetic
trace (one simulation ~0.5 s). ``jobs`` makes each configuration a sweep job (``-m policy=.. cache=..
hw.pcie_gbps=..``); ``tables`` sweeps the bandwidth and lets each job run a policies x caches table.
Prints the wall time, the simulations' own time (``sim_wall_s``, summed) and the overhead per configuration:
(wall x workers - summed simulation time) / configurations, i.e. the worker time a configuration costs beyond
its simulation. ``--out FILE`` appends the record as a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dllm_offload_sim.sim.collect import collect
from dllm_offload_sim.traces.cli import HelpFormatter

POLICIES = [
    "naive_lru",
    "lru",
    "lfu",
    "moe_infinity",
    "finemoe",
    "ktransformers",
    "fiddler",
    "tide",
    "oled",
    "full_residency",
]
CACHES = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
BANDWIDTHS = [8, 16, 24, 32, 48, 64, 80, 96, 112, 128]
COMMON = ["trace=synthetic", "trace.requests=[0]", "sim.per_forward=false", "quiet=true"]


def sweep_args(launcher: str, layout: str, workers: int, sweep: Path) -> list[str]:
    """The ``dllm-sim -m`` arguments of the 1,000-configuration sweep in ``layout`` through ``launcher``."""
    bw = "hw.pcie_gbps=" + ",".join(map(str, BANDWIDTHS))
    if layout == "jobs":
        axes = ["policy=" + ",".join(POLICIES), "cache=" + ",".join(map(str, CACHES)), bw]
    else:
        axes = [
            bw,
            f"table.policies=[{','.join(POLICIES)}]",
            f"table.caches=[{','.join(map(str, CACHES))}]",
            "table.jobs=1",
        ]
    if launcher == "local":
        par = [f"hydra.launcher.n_jobs={workers}"]
    else:
        par = [f"+hydra.launcher.init.num_cpus={workers}"]
    return ["-m", f"hydra/launcher={launcher}", *axes, *COMMON, *par, f"hydra.sweep.dir={sweep}"]


def run(launcher: str, layout: str, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        sweep = Path(d) / "sweep"
        cmd = [sys.executable, "-m", "dllm_offload_sim.sim", *sweep_args(launcher, layout, workers, sweep)]
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=d, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"the sweep failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
        r = collect(sweep)
        n = len(r.table)
        if not r.complete or n != len(POLICIES) * len(CACHES) * len(BANDWIDTHS):
            raise SystemExit(f"the sweep is incomplete: {n} rows, complete={r.complete}")
        sim_s = float(r.table.sim_wall_s.sum())
        return {
            "launcher": launcher,
            "layout": layout,
            "workers": workers,
            "configs": n,
            "jobs": len(BANDWIDTHS) if layout == "tables" else n,
            "wall_s": round(wall, 1),
            "sum_sim_s": round(sim_s, 1),
            "per_config_ms": round(1e3 * wall / n, 1),
            "overhead_per_config_ms": round(1e3 * (wall * workers - sim_s) / n, 1),
            "cores": os.cpu_count(),
        }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python bench/bench_launchers.py",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--launcher", choices=["local", "ray"], default="local")
    p.add_argument("--layout", choices=["jobs", "tables"], default="jobs")
    p.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="parallel workers (default: cores)"
    )
    p.add_argument("--out", type=Path, default=None, help="append the record to this JSON-lines file")
    a = p.parse_args(argv)
    r = run(a.launcher, a.layout, a.workers)
    print(
        f"{r['launcher']:>5} {r['layout']:>6}: {r['configs']} configurations in {r['jobs']} jobs, "
        f"{r['workers']} workers: {r['wall_s']:.1f} s wall ({r['per_config_ms']:.0f} ms per configuration), "
        f"simulations {r['sum_sim_s']:.1f} s, overhead {r['overhead_per_config_ms']:.0f} ms per configuration"
    )
    if a.out:
        with a.out.open("a") as f:
            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
