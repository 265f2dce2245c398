"""The simulator's Hydra app: ``dllm-sim`` (see ``conf/config.yaml``).

No ``policy=``: the main job, every policy of ``table.policies`` at every cache of ``table.caches``
on the configured trace and profile, printed as a table and written to ``summary.parquet``.
``policy=NAME``: that one policy at ``cache`` (default 40); a multirun (``-m``) sweeps any field.

Every run writes into its Hydra output directory: ``summary.parquet`` (one row per policy x cache),
``per_forward.parquet`` and ``per_layer.parquet`` (with ``sim.per_forward``), and, last,
``done.json``. A run directory without ``done.json`` is incomplete; re-running a sweep into the
same ``hydra.sweep.dir`` skips jobs whose ``done.json`` matches their config.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from dllm_offload_sim.costmodel.profile import ProfileError
from dllm_offload_sim.policies.base import PolicyContext, PolicyError
from dllm_offload_sim.sim.allocator import map_large_blocks
from dllm_offload_sim.sim.bound import tpot_bound
from dllm_offload_sim.sim.closed_form import ExpertCallsTable
from dllm_offload_sim.sim.engine import MODEL_VERSION
from dllm_offload_sim.sim.run import READ_WHOLE_ROWS, check_inputs, simulate
from dllm_offload_sim.traces.atomic import atomic_write_json, atomic_write_parquet, parquet_has_columns
from dllm_offload_sim.traces.cli import describe_os_error
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.topology import topology_preset
from dllm_offload_sim.wiring.build import (
    CONF_DIR,
    config_hash,
    cost_model,
    load_trace,
    make_policy,
    requested_ids,
)
from dllm_offload_sim.wiring.errors import ConfigError
from dllm_offload_sim.wiring.spec import SimSettings, job_spec

# a sweep job whose configuration could not run: its error, for the sweep's end and collect
FAILED_FILE = "failed.json"
SUMMARY_COLUMNS = [
    "policy",
    "cache",
    "pcie_gbps",
    "tpot_ms",
    "speedup_vs_baseline",
    "ttft_ms",
    "cache_util",
    "hit_rate",
    "h2d_gb",
    "cpu_experts",
    "sim_wall_s",
]


@dataclass(frozen=True)
class RunJob:
    """A planned run as handed to :func:`run_group` (in this process or a worker): its place in the table and its
    policy config as a plain dict."""

    index: int
    label: str
    policy: dict
    cache: int


@dataclass(frozen=True)
class RunOutput:
    """What :func:`run_group` returns for one run: its summary row and, with ``sim.per_forward``, its tables."""

    index: int
    summary: dict
    per_forward: pd.DataFrame | None
    per_layer: pd.DataFrame | None


def _context(trace, cache, cost, settings: SimSettings) -> PolicyContext:
    return PolicyContext.of(
        trace.topology, cache, cost, settings.cpu_workers, trace.block_length, settings.seed
    )


def table_jobs(want: int, n_runs: int) -> int:
    """Worker processes for the table: ``want`` (``table.jobs``; 0 = one per CPU core), never more than run
    pairs."""
    import os

    if want == 0 and _in_multirun():  # the launcher already runs jobs in parallel
        return 1
    if want == 0:
        want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(want, (n_runs + 1) // 2))


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ValueError, ImportError):
        return False


def run_group(cfg_c: dict, settings: SimSettings, group: list[RunJob], on_done=None) -> list[RunOutput]:
    """Simulate ``group`` in order (in this process or a worker); ``cfg_c`` wires the trace and the profile."""
    cfg = OmegaConf.create(cfg_c)
    trace = load_trace(cfg)  # (model=auto takes the trace's shape)
    model = topology_preset(cfg.model.shape)
    cost = cost_model(cfg)
    ids = requested_ids(cfg, trace)
    # a trace small enough is read once for the group's runs; a larger one is streamed by each run (sim.run.simulate)
    reqs = [trace.request(r) for r in ids] if trace.routing_rows <= READ_WHOLE_ROWS else None
    know: dict = {}  # offline knowledge per request, computed once on first use and shared by the group's runs
    forwards: dict = {}  # the batched forwards, made once and shared by the group's runs (simulate's forwards_cache)
    calls = ExpertCallsTable(
        cost
    )  # the layers' grouped GPU calls under this profile, shared by the group's runs
    # what is loaded now (modules, trace, profile) lives as long as the group: keep the collector's full passes
    # off it (with pandas, hydra and numba loaded, one full pass took ~85 ms, every 2-3 one-request simulations)
    gc.freeze()
    out = []
    for job in group:
        label, c = job.label, job.cache
        r = simulate(
            trace,
            make_policy(OmegaConf.create(job.policy)),
            c,
            cost,
            batch_size=settings.batch_size,
            requests=ids,
            warmup_requests=settings.warmup_requests,
            cpu_workers=settings.cpu_workers,
            seed=settings.seed,
            model=model,
            loaded=reqs,
            knowledge=know,
            forwards_cache=forwards,
            dummy_warmup=settings.dummy_warmup,
            calls=calls,
        )
        r.summary["policy"] = label
        per = settings.per_forward
        out.append(
            RunOutput(
                job.index,
                r.summary,
                r.per_forward.assign(policy=label, cache=c) if per else None,
                r.per_layer.assign(policy=label, cache=c) if per else None,
            )
        )
        if on_done is not None:
            on_done(label, c)
    return out


def run_table(cfg=None, progress: bool = True, out: Path | None = None) -> pd.DataFrame:
    """Run every planned simulation of ``cfg`` (the default config when None); returns the summary."""
    if cfg is None:
        from hydra import compose, initialize_config_dir

        with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
            cfg = compose(config_name="config")
    spec = job_spec(cfg)  # every field checked before anything is loaded
    trace = load_trace(cfg)  # (model=auto takes the trace's shape)
    model = topology_preset(cfg.model.shape)
    cost = cost_model(cfg)
    runs = spec.runs
    policies = [(run, make_policy(run.policy)) for run in runs]  # all config errors before any simulation
    ids = requested_ids(cfg, trace)
    for run, pol in policies:
        c = run.cache
        check_inputs(trace, c, cost, ids, spec.settings, model=model)
        try:  # a policy that cannot take this cache says so now, not after other runs finished
            pol.setup(_context(trace, c, cost, spec.settings))  # (each run builds its own policy again)
        except PolicyError as e:
            raise ConfigError(str(e)) from None
    todo = [
        RunJob(i, run.label, OmegaConf.to_container(run.policy, resolve=True), run.cache)
        for i, run in enumerate(runs)
    ]
    jobs = table_jobs(spec.jobs, len(todo))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc="simulating", unit="run")

    def done(label, c):
        if bar is not None:
            bar.set_postfix_str(f"{label} cache={c}")
            bar.update(1)

    cfg_c = OmegaConf.to_container(cfg, resolve=True)
    results = []
    if jobs <= 1:
        results = run_group(cfg_c, spec.settings, todo, on_done=done)
    else:  # groups of two runs on `jobs` worker processes; each worker reads the trace once per group
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        groups = [todo[k : k + 2] for k in range(0, len(todo), 2)]
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
            futs = [ex.submit(run_group, cfg_c, spec.settings, g) for g in groups]
            for fu in as_completed(futs):
                for res in fu.result():
                    results.append(res)
                    done(res.summary["policy"], res.summary["cache"])
    if bar is not None:
        bar.close()
    results.sort(key=lambda r: r.index)
    rows = [r.summary for r in results]
    fwd_tables = [r.per_forward for r in results if r.per_forward is not None]
    layer_tables = [r.per_layer for r in results if r.per_layer is not None]
    table = pd.DataFrame(rows)
    base = spec.baseline
    table["speedup_vs_baseline"] = float("nan")
    for c in table.cache.unique():
        b = table[(table.policy == base) & (table.cache == c)]
        if len(b):
            sel = table.cache == c
            table.loc[sel, "speedup_vs_baseline"] = float(b.tpot_ms.iloc[0]) / table.loc[sel, "tpot_ms"]
    table["baseline"] = base
    # the TPOT no policy can go below at each cache (sim/bound.py: the shared pool, so every policy)
    bounds = {
        int(c): tpot_bound(
            trace,
            int(c),
            cost,
            requests=ids,
            batch_size=spec.settings.batch_size,
            warmup_requests=spec.settings.warmup_requests,
            dummy_warmup=spec.settings.dummy_warmup,
            cpu_workers=spec.settings.cpu_workers,
        ).tpot_ms
        for c in table.cache.unique()
    }
    table["tpot_bound_ms"] = table.cache.map(bounds)
    if out is not None:
        if fwd_tables:
            atomic_write_parquet(out / "per_forward.parquet", pd.concat(fwd_tables, ignore_index=True))
            atomic_write_parquet(out / "per_layer.parquet", pd.concat(layer_tables, ignore_index=True))
        atomic_write_parquet(out / "summary.parquet", table)
    return table


def format_table(table: pd.DataFrame) -> str:
    """The summary as printed: one row per (policy, cache), then per cache a ``bound`` row, the TPOT no policy can go
    below (``tpot_bound_ms``)."""
    t = table[SUMMARY_COLUMNS].copy()
    if "tpot_bound_ms" in table:
        b = (
            table.drop_duplicates("cache")[["cache", "pcie_gbps", "tpot_bound_ms"]]
            .rename(columns={"tpot_bound_ms": "tpot_ms"})
            .assign(policy="bound")
        )
        t = pd.concat([t, b], ignore_index=True).sort_values("cache", kind="stable")
        t["cpu_experts"] = t.cpu_experts.astype(
            "Int64"
        )  # (the bound rows have none: <NA>, not a float column)
    t["h2d_gb"] = t.h2d_gb.round(1)
    base = table.baseline.iloc[0]
    text = t.rename(columns={"speedup_vs_baseline": f"speedup_vs_{base}"}).to_string(
        index=False, float_format=lambda x: f"{x:.3f}"
    )
    if table.speedup_vs_baseline.isna().any():  # (the column of summary.parquet is speedup_vs_baseline)
        text += (
            f"\nspeedup_vs_{base}: empty where {base} (table.baseline) did not run at that cache in this job; "
            f"dllm-sim-collect computes it across a sweep's jobs"
        )
    return text


def main(cfg: DictConfig):
    from hydra.core.hydra_config import HydraConfig

    map_large_blocks()  # a long run's peak memory stays bounded (sim.allocator)
    out = Path(HydraConfig.get().runtime.output_dir)
    try:
        load_trace(cfg)  # validates the trace first, and model=auto takes its shape (part of the config hash)
        h = config_hash(cfg, salt=f"model {MODEL_VERSION}")
        done = out / "done.json"
        (out / FAILED_FILE).unlink(missing_ok=True)  # a job that failed before is tried again
        summary = out / "summary.parquet"
        if summary.is_file() and not done.is_file() and not is_summary_table(summary):
            raise ConfigError(
                f"{summary} is not a summary this simulator wrote; nothing was written over it: name "
                f"another hydra.run.dir (or hydra.sweep.dir), or move the file"
            )
        if done.is_file():
            finished = read_done(done)
            table = None
            if finished.get("config_hash") == h:
                try:
                    table = pd.read_parquet(out / "summary.parquet")
                except Exception as e:  # deleted or damaged since: the run is done again, its done.json first
                    print(
                        f"[resume] {out}: its summary.parquet is unreadable ({str(e).splitlines()[0][:120]}); "
                        f"running it again",
                        file=sys.stderr,
                    )
            if table is not None:
                print(f"[resume] {out} is complete for this config; not recomputed")
                return float(table.tpot_ms.iloc[0])
            if finished.get("config_hash") != h and not cfg.get("overwrite", False):
                raise ConfigError(
                    f"{out} holds a finished run of another config (config hash "
                    f"{finished.get('config_hash')}, this one {h}: the trace, profile or overrides "
                    f"differ, or the simulator's model changed since); use another hydra.run.dir / "
                    f"hydra.sweep.dir, or overwrite=true to replace it"
                )
        done.unlink(missing_ok=True)
        table = run_table(
            cfg, progress=not cfg.quiet and not _in_multirun(), out=out
        )  # (a sweep has one bar)
        atomic_write_json(
            done,
            {
                "config_hash": h,
                "model_version": MODEL_VERSION,
                "runs": len(table),
                "job_config_sha256": job_config_sha(out),
            },
        )
    except (ConfigError, TraceError, ProfileError, PolicyError, OSError) as e:
        msg = describe_os_error(e) if isinstance(e, OSError) else str(e)
        print(f"error: {msg}", file=sys.stderr)
        if (
            _in_multirun()
        ):  # one job's bad value: recorded for the sweep's end and collect; the other jobs run
            try:
                atomic_write_json(out / FAILED_FILE, {"error": msg})
            except OSError:
                pass
            return float("nan")
        raise SystemExit(2)
    if not _in_multirun():  # a sweep shows its progress bar, and dllm-sim-collect the merged table
        if not cfg.quiet:
            print(format_table(table))
        print(f"wrote {out / 'summary.parquet'}")
    return float(table.tpot_ms.iloc[0])


def is_summary_table(path: Path) -> bool:
    """Whether ``path`` is a ``summary.parquet`` of this simulator (an interrupted run's, before its done.json)."""
    return parquet_has_columns(path, ("policy", "cache", "tpot_ms", "profile"))


def job_config_sha(run_dir: Path) -> str | None:
    """The hash of the config Hydra recorded for this job (``.hydra/config.yaml``), None where there is none.
    A later job started in the same directory rewrites that file, so a ``done.json`` holding another hash
    belongs to another config's results."""
    f = Path(run_dir) / ".hydra" / "config.yaml"
    return hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else None


def read_done(path: Path) -> dict:
    """A run's ``done.json`` (its config hash and run count); an unreadable one is an empty record."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}
