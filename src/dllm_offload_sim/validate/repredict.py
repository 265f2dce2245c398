"""``dllm-repredict RUN_DIR --profile P``: validated runs predicted again, without a GPU.

A validation run keeps what the GPU measured (``runs/*/rows.parquet``, merged into ``fidelity.parquet``). This re-simulates each finished
run of a ``dllm-validate`` run directory with another profile, or the same one with some fields
changed (``--set runtime.cpu_slowdown_beside_copies=0.2``), and writes a fidelity table with the new
predictions beside the stored measurements, to be read by ``validate.report`` and ``validate.figure``.
So a change to the cost model or a newly profiled term can be checked against every stored measurement
offline. The trace, requests, CPU workers and cache come from the run directory's ``.hydra/config.yaml``
(``--trace`` where the recorded trace is not on this machine); each run's prediction charges the policy
decision time its validation measured back to back (``simulated_policy_us_per_layer``) times the profile's
``runtime.policy_time_factor`` (runs from before that factor: what they charged, ``charged_policy_us_per_layer``),
so with the run's own profile the stored predictions come back unchanged. Policies are rebuilt from ``conf/policy/<name>.yaml``; where
their decisions differ from the validated ones (a cost-driven policy under other costs, or changed
defaults) the counters no longer match the measurement, and the table says so; ``--decide-with`` the
run's own profile keeps the validated decisions and changes only the timing. ``--cpu-at-run-bandwidth`` predicts
each run's CPU experts at the host memory bandwidth that run measured before its replays, where the profile's CPU
curve holds the bandwidth it was timed at (a shared host's moves between the two). ``--host-at-run-launch`` predicts
each run's runtime host terms at the kernel-launch time that run measured, where the profile holds its own, and
``--cpu-at-run-probe`` each run's CPU experts at the CPU engine's speed its probe call measured before the replays.
``--cpu-at-run-path`` runs each run's CPU engine as fast as the run measured it (its CPU path over the prediction):
a diagnosis of the rest of the model, which the measurement enters. ``--host-at-run-steps`` likewise charges each run
the host steps its replay measured (bookkeeping, a grouped call's issue, a CPU call's submission), and
``--decisions-at-run`` the decision time its replay measured.

A what-if with a changed field is a diagnosis, not a calibration: shipped profiles carry only measured
values.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dllm_offload_sim.traces.atomic import atomic_write_parquet, atomic_write_text
from dllm_offload_sim.validate.comparison import (
    decision_us_per_layer,
    measured_cpu_path_s,
    predicted_metrics,
    relative_error,
    simulate_as_replayed,
)
from dllm_offload_sim.validate.host_steps import host_steps
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point


def profile_with(path: str, overrides: list[str]) -> str:
    """``path`` itself, or a temporary copy with each ``a.b.c=VALUE`` (VALUE as JSON) set in it."""
    if not overrides:
        return path
    d = json.loads(Path(path).read_text())
    for o in overrides:
        key, sep, val = o.partition("=")
        if not sep or not key:
            raise ValueError(
                f"--set {o!r}: expected FIELD=VALUE, e.g. runtime.cpu_slowdown_beside_copies=0.2"
            )
        try:
            value = json.loads(val)
        except json.JSONDecodeError:
            raise ValueError(f"--set {o!r}: VALUE must be JSON (a number, list, ...), got {val!r}") from None
        *parents, leaf = key.split(".")
        node = d
        for p in parents:
            if (
                node is d and p == "runtime" and p not in d
            ):  # the one optional section: older profiles lack it
                d[p] = {}
            if not isinstance(node.get(p), dict):
                raise ValueError(f"--set {o!r}: {path} has no section {p!r} on the way to {key!r}")
            node = node[p]
        node[leaf] = value
    from dllm_offload_sim.costmodel.profile import validate_profile_dict

    validate_profile_dict(d, f"{path} with --set {' '.join(overrides)}")  # a typo names the file and field
    fh = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with fh:
        json.dump(d, fh)
    return fh.name


@dataclass(frozen=True)
class Repredicted:
    """Finished runs predicted again: their fidelity rows, and their per-forward tables (None where the runs kept
    none) with the new ``predicted_s`` and ``predicted_cpu_path_s`` beside the stored measurements."""

    rows: pd.DataFrame
    forwards: pd.DataFrame | None


def run_probe(g: pd.DataFrame, label: str, cache, metric: str, option: str) -> float:
    """What a validation run measured beside its TPOT (its ``metric`` row: ``host_mem_gbps``, ``host_launch_us``,
    ``cpu_probe_ms``, ``policy_ms_per_forward``); ValueError naming the run where it has none (validated before runs
    measured it)."""
    m = g[g.metric == metric]
    v = float(m.measured.iloc[0]) if len(m) else float("nan")
    if not v > 0:
        raise ValueError(
            f"run {label} at Cache {cache} has no {metric} row (validated before runs measured it): "
            f"{option} needs it"
        )
    return v


def run_cpu_path_factor(
    forwards: pd.DataFrame | None, label: str, cache, predicted: pd.DataFrame
) -> float | None:
    """A run's decode forwards' measured CPU path (its stored ``forwards``) over the one ``predicted`` (a
    simulation's per-forward table, the same forwards in order); None where the run predicts no CPU path.
    ValueError naming the run where its forwards are not at hand."""
    from dllm_offload_sim.traces.schema import PREFILL

    f = None if forwards is None else forwards[(forwards.policy == label) & (forwards.cache == cache)]
    if f is None or len(f) != len(predicted):
        raise ValueError(
            f"run {label} at Cache {cache}: --cpu-at-run-path needs the run's stored per-forward table "
            f"({0 if f is None else len(f)} forwards against {len(predicted)} simulated)"
        )
    decode = np.asarray(predicted.phase) != PREFILL
    pred = float(np.asarray(predicted.cpu_path_s, float)[decode].sum())
    if not pred > 0:
        return None
    return float(measured_cpu_path_s(f, "measured_")[decode].sum()) / pred


def run_host_steps(forwards: pd.DataFrame | None, label: str, cache, sim) -> dict:
    """The host steps a run's replay measured in its decode forwards (its stored ``forwards``), as the runtime terms
    the simulator charges for them: the bookkeeping per MoE layer (``bookkeeping_s``, and ``bookkeeping_cpu_s`` after a
    layer with a CPU call), a grouped call's issue (``grouped_issue_s``, and ``grouped_issue_cpu_s`` beside a CPU call)
    and a CPU call's submission (``cpu_issue_s``, over the layers ``sim`` ran a CPU call in;
    ``sim`` must have recorded its layers). A step the run never took is left out. ValueError naming the run where
    its forwards are not at hand or predate the host stamps."""
    from dllm_offload_sim.traces.schema import PREFILL

    f = None if forwards is None else forwards[(forwards.policy == label) & (forwards.cache == cache)]
    pf = sim.per_forward
    if f is None or len(f) != len(pf):
        raise ValueError(
            f"run {label} at Cache {cache}: --host-at-run-steps needs the run's stored per-forward table "
            f"({0 if f is None else len(f)} forwards against {len(pf)} simulated)"
        )
    decode = np.asarray(pf.phase) != PREFILL
    layers = sim.layers[
        sim.layers.forward.isin(set(np.asarray(pf.forward)[decode]))
    ]  # the decode forwards' MoE layers
    try:
        measured = host_steps(f, int(layers.layer.nunique())).iloc[
            0
        ]  # per MoE layer and per grouped call, us
    except ValueError as e:
        raise ValueError(f"run {label} at Cache {cache}: {e}: --host-at-run-steps needs them") from None
    # the run's own steps in every layer, with the engine or without
    steps = dict.fromkeys(("bookkeeping_s", "bookkeeping_cpu_s"), 1e-6 * float(measured.bookkeeping_us))
    if measured.grouped_issue_us == measured.grouped_issue_us:
        steps.update(
            dict.fromkeys(("grouped_issue_s", "grouped_issue_cpu_s"), 1e-6 * float(measured.grouped_issue_us))
        )
    cpu_calls = int((layers.to_cpu > 0).sum())
    if cpu_calls > 0:
        steps["cpu_issue_s"] = float(f[decode].measured_cpu_issue_s.sum()) / cpu_calls
    return steps


def repredict_rows(
    rows: pd.DataFrame,
    trace,
    cost,
    requests,
    cpu_workers: int = 1,
    decision_cost=None,
    forwards: pd.DataFrame | None = None,
    cpu_at_run_bandwidth: bool = False,
    decisions_here: bool = False,
    host_at_run_launch: bool = False,
    cpu_at_run_probe: bool = False,
    cpu_at_run_path: bool = False,
    host_at_run_steps: bool = False,
    decisions_at_run: bool = False,
) -> Repredicted:
    """The fidelity rows of finished runs with ``predicted`` (and errors) of TPOT, prefill and the counters
    simulated again under ``cost`` (the policies deciding with ``decision_cost``'s costs where given);
    measured values as stored. With the runs' stored per-forward tables (``forwards``), those too, predicted
    again forward by forward. ``cpu_at_run_bandwidth``: each run's CPU expert costs are the profile's at the host
    memory bandwidth that run measured (:meth:`HardwareProfile.at_memory_bandwidth`), and its ``host_mem_gbps`` row
    predicts that bandwidth. ``host_at_run_launch``: each run's runtime host terms are the profile's at the kernel-launch
    time that run measured (:meth:`HardwareProfile.at_host_launch`). ``cpu_at_run_probe``: each run's CPU expert costs
    are the profile's at the CPU engine probe call time that run measured (:meth:`HardwareProfile.at_cpu_probe`; not
    with ``cpu_at_run_bandwidth``, both scale the same costs). ``cpu_at_run_path`` (needs ``forwards``): each run's
    CPU expert costs scaled by its decode forwards' measured CPU path over the one predicted here, so the CPU
    engine runs as fast as it did in the run: a diagnosis of everything but the engine's speed, not a prediction
    (the measurement enters it). ``host_at_run_steps`` (needs ``forwards``): each run charges the host steps its
    replay measured (:func:`run_host_steps`) in place of the profile's, a diagnosis of the host's steps; with
    ``cpu_at_run_path`` too, the CPU path's factor is taken after the host steps are set. ``decisions_at_run``: each
    run charges the decision time its replay measured (its ``policy_ms_per_forward`` row over the MoE layers), a
    diagnosis of the charged decision time (not with ``decisions_here``). ``decisions_here``: each run charges the
    decision time a simulation measures on this machine now (:func:`decision_us_per_layer`; the rows' ``simulated_policy_us_per_layer`` and
    ``charged_policy_us_per_layer`` say it), not the one its validation measured."""
    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.wiring.build import make_policy, policy_config

    reqs = [trace.request(r) for r in requests]
    # the new profile's host launch time and CPU curve's memory bandwidth beside the run's (the report's host columns)
    launch = float(cost.profile.stamp.get("host_launch_us", float("nan")))
    mem = cost.profile.cpu_curve_gbps()
    mem = float("nan") if mem is None else mem
    probe = cost.profile.cpu_probe_s()
    probe = float("nan") if probe is None else 1e3 * probe
    if decisions_here and decisions_at_run:
        raise ValueError(
            "--decisions-here and --decisions-at-run each set the decision time charged: pass one"
        )
    out, fwd_out = [], []
    for (label, cache), g in rows.groupby(["policy", "cache"], sort=False):
        g = g.copy()
        if decisions_at_run:  # what the replay's decisions took, per MoE layer
            charged = (
                1e3
                * run_probe(g, label, cache, "policy_ms_per_forward", "--decisions-at-run")
                / trace.topology.n_moe_layers
            )
            g["charged_policy_us_per_layer"] = charged
        elif decisions_here:  # the decision time measured here and now, under this profile's factor
            simulated = decision_us_per_layer(
                trace,
                lambda: make_policy(policy_config(label)),
                int(cache),
                cost,
                list(requests),
                cpu_workers,
                reqs,
                decision_cost,
            )
            charged = simulated * cost.policy_time_factor
            g["simulated_policy_us_per_layer"], g["charged_policy_us_per_layer"] = simulated, charged
        elif (
            "simulated_policy_us_per_layer" in g
        ):  # the run's back-to-back decision time, under this profile's factor
            charged = float(g.simulated_policy_us_per_layer.iloc[0]) * cost.policy_time_factor
        else:  # a run from before the factor: what it charged
            charged = (
                float(g.charged_policy_us_per_layer.iloc[0]) if "charged_policy_us_per_layer" in g else 0.0
            )
        run_cost, run_mem, run_launch, pred_extra = cost, mem, launch, {"cpu_probe_ms": probe}
        if cpu_at_run_bandwidth or host_at_run_launch or cpu_at_run_probe:
            prof = cost.profile
            if cpu_at_run_bandwidth:
                run_mem = run_probe(g, label, cache, "host_mem_gbps", "--cpu-at-run-bandwidth")
                prof = prof.at_memory_bandwidth(run_mem)
            if cpu_at_run_probe:
                run_probe_ms = run_probe(g, label, cache, "cpu_probe_ms", "--cpu-at-run-probe")
                prof = prof.at_cpu_probe(run_probe_ms / 1e3)
                pred_extra["cpu_probe_ms"] = run_probe_ms
            if host_at_run_launch:
                run_launch = run_probe(g, label, cache, "host_launch_us", "--host-at-run-launch")
                prof = prof.at_host_launch(run_launch)
            run_cost = CostModel(prof)
        charge = charged if charged == charged else 0.0

        def predict(cost, record_layers: bool = False):
            return simulate_as_replayed(
                trace,
                make_policy(policy_config(label)),
                int(cache),
                cost.with_policy_time(charge),
                list(requests),
                cpu_workers,
                reqs,
                decision_cost=decision_cost,
                record_layers=record_layers,
            )

        sim = predict(run_cost, record_layers=host_at_run_steps)
        if host_at_run_steps:
            steps = run_host_steps(forwards, label, cache, sim)
            run_cost = CostModel(
                run_cost.profile.with_runtime_terms(steps, "the host steps the run measured")
            )
            sim = predict(run_cost)
        if cpu_at_run_path:
            factor = run_cpu_path_factor(forwards, label, cache, sim.per_forward)
            if factor is not None:
                run_cost = CostModel(run_cost.profile.with_cpu_speed(factor, "the run's measured CPU path"))
                sim = predict(run_cost)
        pred = {
            **predicted_metrics(sim),
            "host_launch_us": run_launch,
            "host_mem_gbps": run_mem,
            **pred_extra,
        }
        for i, r in g.iterrows():
            if r.metric in pred:
                p = float(pred[r.metric])
                err = relative_error(p, float(r.measured))
                g.loc[i, ["predicted", "signed_rel_err", "abs_rel_err"]] = [p, err, abs(err)]
        out.append(g)
        if forwards is not None:
            f = forwards[(forwards.policy == label) & (forwards.cache == cache)].copy()
            pf = sim.per_forward
            if len(f) == len(pf):  # forward by forward, in the replay's order
                f["predicted_s"] = np.asarray(pf.duration_s, float)
                f["predicted_cpu_path_s"] = np.asarray(pf.cpu_path_s, float)
                fwd_out.append(f)
    return Repredicted(
        pd.concat(out, ignore_index=True), pd.concat(fwd_out, ignore_index=True) if fwd_out else None
    )


def forwards_path(table: Path) -> Path:
    """Where the per-forward table of a re-predicted fidelity table is written: ``NAME_forwards.parquet`` beside
    ``NAME.parquet`` (or ``NAME.csv``)."""
    return table.with_name(f"{table.stem}_forwards.parquet")


def _run_config(run_dir: Path):
    from omegaconf import OmegaConf

    f = run_dir / ".hydra" / "config.yaml"
    if not f.is_file():
        raise FileNotFoundError(f"{run_dir}: no .hydra/config.yaml (not a dllm-validate run directory)")
    return OmegaConf.load(f)


def main(argv=None) -> int:
    from dllm_offload_sim.costmodel.profile import HardwareProfile

    p = argparse.ArgumentParser(
        prog="dllm-repredict",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-repredict validation/h100/mini "
        "--profile validation/h100/mini/profile.json "
        "--set runtime.cpu_slowdown_beside_copies=0.2 --out /tmp/whatif.parquet",
    )
    p.add_argument(
        "run_dir",
        help="a dllm-validate run directory (its finished runs under runs/, or its fidelity.parquet)",
    )
    p.add_argument("--profile", required=True, help="the profile to predict with (a path or a shipped name)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a field of the profile first (dotted path, JSON value); repeatable",
    )
    p.add_argument(
        "--decide-with",
        metavar="PROFILE",
        help="the profile the policies decide with (cost-driven ones: OLED's split, clairvoyant_coop's "
        "bypass, ...): pass the run's own profile to keep the validated decisions and change only "
        "the timing (default: --profile, decisions may change and the counters then differ)",
    )
    p.add_argument(
        "--cpu-at-run-bandwidth",
        action="store_true",
        help="scale each run's CPU expert costs from the bandwidth the profile's CPU curve was timed at to "
        "the host memory bandwidth the run measured before its replays (runs validated with the probe: "
        "their host_mem_gbps rows); the what-if of a CPU cost that follows the host's memory speed",
    )
    p.add_argument(
        "--host-at-run-launch",
        action="store_true",
        help=f"scale each run's runtime host terms (runtime.{', '.join(HardwareProfile.HOST_TERMS)}) from the "
        "profile's kernel-launch time to the one the run measured (its host_launch_us row); the what-if "
        "of host work that follows the host's single-thread speed",
    )
    p.add_argument(
        "--cpu-at-run-probe",
        action="store_true",
        help="scale each run's CPU expert costs from the CPU engine probe call the profile timed around its "
        "CPU curve (cpu_expert.probe_s) to the one the run timed before its replays (its cpu_probe_ms "
        "row); the what-if of a CPU cost that follows the engine's own speed",
    )
    p.add_argument(
        "--cpu-at-run-path",
        action="store_true",
        help="scale each run's CPU expert costs by its decode forwards' measured CPU path over the one "
        "predicted, so the CPU engine runs as fast as it did in the run: a diagnosis of the rest of the "
        "model (overlap, dispatch, host terms), not a prediction",
    )
    p.add_argument(
        "--host-at-run-steps",
        action="store_true",
        help="charge each run the host steps its replay measured in its decode forwards (the bookkeeping "
        "per MoE layer, a grouped call's issue, a CPU call's submission: runtime.bookkeeping_s, "
        "grouped_issue_s, cpu_issue_s) in place of the profile's: a diagnosis of the host's steps, "
        "which the measurement enters, not a prediction",
    )
    p.add_argument(
        "--decisions-at-run",
        action="store_true",
        help="charge each run the policy decision time its replay measured (its policy_ms_per_forward row "
        "over the MoE layers) instead of its simulation's back-to-back time under the profile's "
        "factor: a diagnosis of the decision time charged, which the measurement enters",
    )
    p.add_argument(
        "--decisions-here",
        action="store_true",
        help="charge each run the policy decision time a simulation measures on this machine now (two "
        "simulations per run, as dllm-validate measures it), not the one stored with the run: the "
        "what-if of a change to what counts as decision time",
    )
    p.add_argument("--trace", help="the trace (default: the one the run directory's config names)")
    p.add_argument(
        "--out", help="write the new fidelity table here (.parquet or .csv); default: print the summary only"
    )
    a = p.parse_args(argv)

    from dllm_offload_sim.costmodel.cost_model import CostModel
    from dllm_offload_sim.costmodel.profile import ProfileError
    from dllm_offload_sim.wiring.build import load_trace
    from dllm_offload_sim.traces.errors import TraceError
    from dllm_offload_sim.validate.comparison import summarize
    from dllm_offload_sim.validate.run_store import stored_forwards, stored_rows

    run_dir = Path(a.run_dir)
    try:
        cfg = _run_config(run_dir)
        rows = stored_rows(run_dir)
        if rows is None:
            raise FileNotFoundError(f"{run_dir}: no finished runs under runs/ and no fidelity.parquet")
        if a.trace:
            cfg.trace.path = a.trace
        try:
            trace = load_trace(cfg)
        except (FileNotFoundError, TraceError) as e:
            raise FileNotFoundError(f"the run's trace cannot be opened ({e}); pass --trace") from None
        cost = CostModel(profile_with(a.profile, a.set))
        decide = CostModel(a.decide_with) if a.decide_with else None
        again = repredict_rows(
            rows,
            trace,
            cost,
            list(cfg.validate.requests),
            int(cfg.hw.cpu_workers),
            decide,
            forwards=stored_forwards(run_dir),
            cpu_at_run_bandwidth=a.cpu_at_run_bandwidth,
            decisions_here=a.decisions_here,
            host_at_run_launch=a.host_at_run_launch,
            cpu_at_run_probe=a.cpu_at_run_probe,
            cpu_at_run_path=a.cpu_at_run_path,
            host_at_run_steps=a.host_at_run_steps,
            decisions_at_run=a.decisions_at_run,
        )
        table = again.rows
    except (FileNotFoundError, ValueError, ProfileError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summarize(table))
    if a.out:
        out = Path(a.out)
        if out.suffix == ".csv":
            atomic_write_text(out, table.to_csv(index=False))
        else:
            atomic_write_parquet(out, table)
        print(f"wrote {out}")
        if again.forwards is not None:  # beside the table, where dllm-report looks for it
            fwd = forwards_path(out)
            atomic_write_parquet(fwd, again.forwards)
            print(f"wrote {fwd}")
    return 0


cli = entry_point(main)  # console entry point ``dllm-repredict``


if __name__ == "__main__":
    cli()
