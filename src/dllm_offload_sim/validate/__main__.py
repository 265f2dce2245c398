"""``dllm-validate``: run policies on the real GPU (replay mode) and compare with the simulator.

Its config is ``conf/validate.yaml`` (the simulator's groups: model, trace, hw, policy). Without
``policy=`` it validates every policy of ``validate.policies`` at every cache of ``validate.caches``; with
``policy=NAME`` that one at ``cache``. Writes ``fidelity.parquet`` (+ ``fidelity.csv``, ``fidelity_forwards.parquet``) into the run
directory and prints the table. Each finished run is kept under ``runs/``: re-running into the same
``hydra.run.dir`` after an interruption redoes only the runs that did not finish. ``validate.repeats=N``
replays each run N times (fresh policy and engine each): the measured values are the median repeat's and
every row carries the repeats' range (``measured_min``, ``measured_max``); ``validate.interleave`` (default true)
replays them in rounds across the runs (``validate.sweep``), and each repeat is kept as it finishes. The table also
holds the runs an earlier invocation finished in the same directory under the same config, trace and profile (a sweep
split by cache over several calls: ``validate.caches=[20]``, then ``[40]``, ...), and says which.
Needs a CUDA GPU; the profile of this machine is ``hw.profile`` (default h200-<model>).
"""

import sys
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf


def sweep_key(cfg) -> str:
    """What every run of this sweep shares: the config without the run list, plus its inputs' contents."""
    from dllm_offload_sim.wiring.build import config_hash

    c = OmegaConf.to_container(cfg, resolve=True)
    for k in ("policy", "cache"):
        c.pop(k, None)
    # the run list, and the order runs are replayed in (not what a run measures), leave the key alone
    c["validate"] = {k: v for k, v in c["validate"].items() if k not in ("policies", "caches", "interleave")}
    if not c["validate"].get(
        "layer_timeline"
    ):  # off (the default) keeps the keys of sweeps from before the setting
        c["validate"].pop("layer_timeline", None)
    return config_hash(OmegaConf.create(c))


def round_line(label: str, cache: int, k: int, repeats: int, replay) -> str:
    """The line a sweep prints after repeat ``k`` of a run (``replay``: a ``fidelity.Replay``)."""
    return (
        f"  round {k + 1}/{repeats}: {label:26s} cache {cache:3d}: TPOT measured "
        f"{replay.summary['tpot_ms']:8.3f} ms  [{replay.setup_s + replay.replay_s:.0f} s]"
    )


def run_line(n: int, total: int, label: str, cache: int, rows: list[dict], resumed: bool) -> str:
    """The line a sweep prints once a run is complete (the ``n``-th of ``total``), from its fidelity ``rows``."""
    t = [x for x in rows if x["metric"] == "tpot_ms"][0]
    wall = {k: t.get(k, 0.0) for k in ("simulate_s", "setup_s", "replay_s")}
    how = (
        "resumed"
        if resumed
        else (
            f"{sum(wall.values()):.0f} s: simulate {wall['simulate_s']:.1f}, set-up {wall['setup_s']:.1f}, replay "
            f"{wall['replay_s']:.1f}; decisions charged {t['charged_policy_us_per_layer']:.0f} us/layer"
        )
    )
    rng = (
        f", {t['repeats']} repeats {t['measured_min']:.3f} .. {t['measured_max']:.3f}"
        if t.get("repeats", 1) > 1
        else ""
    )
    return (
        f"[{n}/{total}] {label:26s} cache {cache:3d}: TPOT predicted {t['predicted']:8.3f} ms, "
        f"measured {t['measured']:8.3f} ms ({100 * t['signed_rel_err']:+.1f}%{rng})  [{how}]"
    )


@hydra.main(version_base="1.3", config_path="../conf", config_name="validate")
def main(cfg: DictConfig):
    import torch
    from hydra.core.hydra_config import HydraConfig

    from dllm_offload_sim.costmodel.profile import ProfileError
    from dllm_offload_sim.traces.cli import describe_os_error
    from dllm_offload_sim.traces.errors import TraceError
    from dllm_offload_sim.wiring.build import (
        cost_model,
        int_field,
        int_list_field,
        load_trace,
        make_policy,
        policy_config,
    )
    from dllm_offload_sim.wiring.spec import plan_runs
    from dllm_offload_sim.wiring.errors import ConfigError
    from dllm_offload_sim.traces.atomic import atomic_write_parquet, atomic_write_text
    from dllm_offload_sim.validate.comparison import summarize
    from dllm_offload_sim.runtime.cpu_engine import ENGINES
    from dllm_offload_sim.validate.run_store import RunStore, run_key
    from dllm_offload_sim.validate.sweep import SweepRun, SweepSettings, earlier_runs, run_sweep
    from dllm_offload_sim.profiler.summary import host_moved, missing_runtime_terms, suspect_cpu_points

    try:  # every setting checked before anything runs
        repeats = int_field("validate.repeats", cfg.validate.repeats, 1)
        runs = plan_runs(cfg, "validate")
        requests = int_list_field("validate.requests", cfg.validate.requests, 0)
        engine = cfg.validate.get("cpu_engine")
        if engine is not None and engine not in ENGINES:
            raise ConfigError(
                f"validate.cpu_engine={engine!r}: expected null (the profile's) or one of "
                f"{', '.join(ENGINES)}"
            )
        if not torch.cuda.is_available():
            raise ConfigError("dllm-validate needs a CUDA GPU (replay mode runs real copies and kernels)")
        trace, cost = load_trace(cfg), cost_model(cfg)
    except (ConfigError, TraceError, ProfileError, OSError) as e:
        print(f"error: {describe_os_error(e) if isinstance(e, OSError) else e}", file=sys.stderr)
        raise SystemExit(2)
    moved = host_moved(cost.profile)  # its CPU curve holds one speed of a host that had several
    for bad in (
        suspect_cpu_points(cost.profile)
        + ([moved] if moved else [])  # CPU paths will be mispredicted
        + missing_runtime_terms(cost.profile)
    ):
        print(f"warning: profile {cost.profile.path or cost.profile.name}: {bad}", file=sys.stderr)
    out = Path(HydraConfig.get().runtime.output_dir)
    store, base = RunStore(out), sweep_key(cfg)
    for name in ("fidelity.parquet", "fidelity.csv"):  # rewritten once every run is done
        (out / name).unlink(missing_ok=True)
    sweep = [
        SweepRun(
            r.label,
            lambda p=r.policy: make_policy(p),
            r.cache,
            run_key(base, r.label, OmegaConf.to_container(r.policy, resolve=True), r.cache),
        )
        for r in runs
    ]
    settings = SweepSettings(
        repeats=repeats,
        interleave=bool(cfg.validate.get("interleave", True)),
        cpu_workers=cfg.hw.cpu_workers,
        n_real_layers=cfg.validate.n_real_layers,
        charge_policy_time=cfg.validate.charge_policy_time,
        cpu_engine=engine,
        record_layers=bool(cfg.validate.get("layer_timeline", False)),
    )
    n_done = 0

    def replayed(r, k, rep):  # a line per repeat where runs take several, interleaved
        if repeats > 1 and settings.interleave and not cfg.get("quiet", False):
            print(round_line(r.label, r.cache, k, repeats, rep), flush=True)

    def finished(i, res, resumed):
        nonlocal n_done
        n_done += 1
        print(run_line(n_done, len(sweep), sweep[i].label, sweep[i].cache, res.rows, resumed), flush=True)

    results = run_sweep(sweep, store, trace, cost, requests, settings, on_replay=replayed, on_run=finished)

    def key_of(label, cache):  # the key this sweep gives a run another invocation made into this directory
        try:
            pcfg = policy_config(label, cfg.get("policy_dirs") or [])
        except ConfigError:
            return None
        return run_key(base, label, OmegaConf.to_container(pcfg, resolve=True), cache)

    try:  # e.g. another cache, run by an earlier call: one table
        earlier = earlier_runs(store, sweep, key_of)
    except ValueError as e:  # an unreadable run of another call costs this call's table nothing
        print(f"warning: the table holds this call's runs only: {e}", file=sys.stderr)
        earlier = []
    if earlier:
        print(
            f"the table also holds {len(earlier)} runs finished earlier in {out} under the same config, trace and "
            f"profile: {', '.join(f'{e.label} cache {e.cache}' for e in earlier)}"
        )
    results += [e.result for e in earlier]
    rows = [x for res in results for x in res.rows]
    forwards = [res.forwards for res in results]
    layers = [res.layers for res in results if res.layers is not None]
    table = pd.DataFrame(rows)
    atomic_write_parquet(out / "fidelity_forwards.parquet", pd.concat(forwards, ignore_index=True))
    if layers:
        atomic_write_parquet(out / "fidelity_layers.parquet", pd.concat(layers, ignore_index=True))
    atomic_write_text(out / "fidelity.csv", table.to_csv(index=False))
    atomic_write_parquet(out / "fidelity.parquet", table)
    print(summarize(table))
    print(f"wrote {out / 'fidelity.parquet'}")


def cli() -> None:
    """Console entry point: a launcher whose plugin is missing is named before Hydra runs."""
    from dllm_offload_sim.wiring.launchers import missing_launcher

    msg = missing_launcher(sys.argv[1:])
    if msg:
        print(msg, file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
