"""``python -m validate``: run policies on the real GPU (replay mode) and compare with the simulator.

Uses the simulator's config groups (conf/). Without ``policy=`` it validates every policy of
``validate.policies`` at every cache of ``validate.caches``; with ``policy=NAME`` that one at
``cache``. Writes ``fidelity.parquet`` (+ ``fidelity.csv``) into the run directory and prints the table.
Needs a CUDA GPU; the profile of this machine is ``hw.profile`` (default h200-<model>).
"""

import sys
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig):
    import torch
    from hydra.core.hydra_config import HydraConfig

    from sim.app import DEFAULT_CACHE, cost_model, load_trace, make_policy, policy_config
    from traces.atomic import atomic_write_parquet, atomic_write_text
    from validate.fidelity import fidelity_rows, summarize
    from validate.host_experts import HostExperts

    if not torch.cuda.is_available():
        print("error: python -m validate needs a CUDA GPU (replay mode runs real copies and kernels)", file=sys.stderr)
        raise SystemExit(2)
    out = Path(HydraConfig.get().runtime.output_dir)
    trace, cost = load_trace(cfg), cost_model(cfg)
    if cfg.get("policy") is not None:
        runs = [(HydraConfig.get().runtime.choices.get("policy"), cfg.policy,
                 int(cfg.cache if cfg.cache is not None else DEFAULT_CACHE))]
    else:
        caches = [int(cfg.cache)] if cfg.cache is not None else list(cfg.validate.caches)
        runs = [(n, policy_config(n), c) for n in cfg.validate.policies for c in caches]
    requests = list(cfg.validate.requests)
    host = HostExperts(trace.topology, n_real_layers=cfg.validate.n_real_layers)
    rows, forwards = [], []
    for label, pcfg, c in runs:
        rows += fidelity_rows(trace, lambda p=pcfg: make_policy(p), label, c, cost, requests,
                              cpu_workers=cfg.hw.cpu_workers, n_real_layers=cfg.validate.n_real_layers, host=host,
                              charge_policy_time=cfg.validate.charge_policy_time)
        forwards.append(fidelity_rows.last_forwards)
        r = [x for x in rows if x["policy"] == label and x["cache"] == c and x["metric"] == "tpot_ms"][0]
        print(f"{label:26s} cache {c:3d}: TPOT predicted {r['predicted']:8.3f} ms, measured {r['measured']:8.3f} ms "
              f"({100 * r['signed_rel_err']:+.1f}%)", flush=True)
    table = pd.DataFrame(rows)
    atomic_write_parquet(out / "fidelity.parquet", table)
    atomic_write_text(out / "fidelity.csv", table.to_csv(index=False))
    atomic_write_parquet(out / "fidelity_forwards.parquet", pd.concat(forwards, ignore_index=True))
    print(summarize(table))
    print(f"wrote {out / 'fidelity.parquet'}")


if __name__ == "__main__":
    main()
