"""TPOT against PCIe bandwidth for a few policies, as a table and a plot (the paper's Fig. 17b, on your trace).

    python examples/pcie_sweep.py --out pcie.png
    python examples/pcie_sweep.py --trace traces_out/mine --policies naive_lru,oled --cache 40 --out mine.png

The same sweep as Hydra jobs (resumable, on a cluster too):
    dllm-sim -m policy=naive_lru,oled cache=40 hw.pcie_gbps=16,32,64,128 hydra.sweep.dir=sweeps/pcie
    dllm-sim-collect sweeps/pcie
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dllm_offload_sim.costmodel import CostModel  # noqa: E402
from dllm_offload_sim.sim.run import simulate  # noqa: E402
from dllm_offload_sim.traces.atomic import atomic_savefig  # noqa: E402
from dllm_offload_sim.traces.reader import Trace  # noqa: E402
from dllm_offload_sim.traces.shipped import resolve_trace  # noqa: E402
from dllm_offload_sim.wiring.build import make_policy, policy_config, shape_of  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--trace", default=None, help="trace directory or shipped name (default: the shipped real trace)"
    )
    p.add_argument("--policies", default="naive_lru,oled", help="comma-separated policy names (conf/policy/)")
    p.add_argument("--cache", type=int, default=40)
    p.add_argument("--gbps", default="16,32,64,128", help="comma-separated PCIe bandwidths, GB/s")
    p.add_argument("--requests", type=int, nargs="*", default=None, help="request ids (default: all)")
    p.add_argument("--out", default="outputs/pcie_sweep.png", help="the plot (PNG or PDF)")
    a = p.parse_args(argv)
    trace = Trace.open(resolve_trace(a.trace))
    rows = []
    for gbps in (float(g) for g in a.gbps.split(",")):
        cost = CostModel(f"h200-{shape_of(trace)}", pcie_gbps=gbps)
        for name in a.policies.split(","):
            s = simulate(
                trace, make_policy(policy_config(name)), a.cache, cost, requests=a.requests, dummy_warmup=True
            ).summary
            rows.append({"policy": name, "pcie_gbps": gbps, "tpot_ms": s["tpot_ms"]})
    t = pd.DataFrame(rows)
    print(t.pivot(index="pcie_gbps", columns="policy", values="tpot_ms").round(2).to_string())
    fig, ax = plt.subplots(figsize=(4.5, 3))
    for name, g in t.groupby("policy"):
        ax.plot(g.pcie_gbps, g.tpot_ms, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(t.pcie_gbps.unique()), [f"{g:g}" for g in sorted(t.pcie_gbps.unique())])
    ax.set_xlabel("PCIe bandwidth (GB/s)")
    ax.set_ylabel("TPOT (ms)")
    ax.set_title(f"Cache {a.cache}, {trace.path.name}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_savefig(fig, a.out, dpi=130)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
