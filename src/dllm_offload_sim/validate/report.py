"""``dllm-report FIDELITY [...]``: the fidelity tables as Markdown.

Per model: one row per validated run (policy x cache) with predicted and measured TPOT and prefill
(TTFT forward) time and their signed errors, whether the counters (hits, demand copies, CPU experts,
prefetch copies) agree exactly (in every repeat), the policy's decision time per forward and, for a run
replayed ``validate.repeats`` times, its measured TPOT range and whether the prediction lies in it; then the median and
maximum absolute errors against the targets (median <= 5%, max <= 10%), how many of the pairs of policies the
measurement orders the simulator orders the same way (``validate.ranking``), and OLED against Naive-LRU. Where the per-forward tables
are at hand (a run directory's ``runs/*/forwards.parquet``, or ``fidelity_forwards.parquet`` beside a
table), a second table says where the time goes per decode forward: the simulator's and the replay's
CPU path, the GPU work still queued when the host had issued the forward, and the host's time from each
layer's routing to its last launch, the part of it before the first launch (the runtime's bookkeeping)
and issuing copies, and the CPU worker's start and hand-back delays (submit to start, end to the host
thread holding the result); then, per model, the gap of a decode forward fitted as a cost per demand copy, per CPU
expert and per forward (``validate.residuals``); and where runs recorded their per-layer timeline
(``validate.layer_timeline``), a layer's span and its parts, predicted and measured (``validate.layer_timeline``
module). With ``--profile``, the replay's host steps per MoE layer beside what that profile charges for them
(``validate.host_steps``). For a run directory whose runs kept their repeats, the CPU path of every repeat over its
prediction in the order the repeats finished, which tells a host that moved from a model that is off
(``validate.sweep_drift``).
Reads the tables ``dllm-validate`` writes; prints the Markdown or writes it to ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from dllm_offload_sim.traces.atomic import atomic_write_text
from dllm_offload_sim.validate.error_stats import error_stats
from dllm_offload_sim.validate.comparison import COUNTERS, measured_cpu_path_s
from dllm_offload_sim.validate.figure import TABLES_HELP, load_tables_cli
from dllm_offload_sim.validate.host_steps import host_steps_table
from dllm_offload_sim.validate.layer_timeline import (
    cooperative_parts_table,
    copies_fit_table,
    cpu_excess_table,
    timeline_table,
)
from dllm_offload_sim.validate.ranking import head_to_head, ranking_agreement
from dllm_offload_sim.validate.residuals import residual_fit
from dllm_offload_sim.validate.sweep_drift import drift_lines, drift_table, repeat_drift
from dllm_offload_sim.traces.cli import HelpFormatter, entry_point

TARGET_MEDIAN, TARGET_MAX = 0.05, 0.10  # |TPOT error| across a sweep (the validator issue's targets)


def run_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, policy, cache): predicted/measured TPOT and prefill, errors, counters, decision time."""
    key = ["model", "policy", "cache"] if "model" in table else ["policy", "cache"]
    rows = []
    for k, g in table.groupby(key, sort=False):
        m = g.set_index("metric")
        r = dict(zip(key, k if isinstance(k, tuple) else (k,)))
        for met in ("tpot_ms", "prefill_ms"):
            r[f"{met}_pred"], r[f"{met}_meas"] = float(m.at[met, "predicted"]), float(m.at[met, "measured"])
            r[f"{met}_err"] = float(m.at[met, "signed_rel_err"])
        # independent replays of the run (tables of older versions have one and no range columns)
        rep = m.at["tpot_ms", "repeats"] if "repeats" in m else float("nan")
        r["repeats"] = int(rep) if rep == rep else 1
        r["tpot_ms_min"], r["tpot_ms_max"] = (
            (float(m.at["tpot_ms", "measured_min"]), float(m.at["tpot_ms", "measured_max"]))
            if "measured_min" in m
            else (float("nan"), float("nan"))
        )
        cnt = m.loc[m.index.isin(COUNTERS)]
        same = (cnt.predicted == cnt.measured).all()
        if "measured_min" in cnt and cnt.measured_min.notna().all():  # and in every repeat
            same = (
                same
                and (cnt.measured_min == cnt.predicted).all()
                and (cnt.measured_max == cnt.predicted).all()
            )
        r["counters_equal"] = bool(same)
        r["decision_ms"] = (
            float(m.at["policy_ms_per_forward", "measured"])
            if "policy_ms_per_forward" in m.index
            else float("nan")
        )
        for met, col in (("host_launch_us", "launch"), ("host_mem_gbps", "mem"), ("cpu_probe_ms", "probe")):
            # absent in tables of older versions
            h = m.loc[met] if met in m.index else None
            r[f"{col}_prof"] = float(h.predicted) if h is not None else float("nan")
            r[f"{col}_run"] = float(h.measured) if h is not None else float("nan")
        rows.append(r)
    return pd.DataFrame(rows)


def _profile_vs_run(prof: float, run: float, digits: int = 1) -> str:
    """A host probe when profiled and during the run, ``-`` where not measured (its drift moves host-bound times:
    the kernel-launch time moves the runtime's host work, the memory bandwidth and the CPU engine's probe call the
    CPU experts)."""
    if run != run:
        return "-"
    return f"{prof:.{digits}f} / {run:.{digits}f}" if prof == prof else f"- / {run:.{digits}f}"


def _repeats(r) -> str:
    """The run's measured TPOT range over its repeats and whether the prediction falls inside it."""
    if r.repeats < 2 or r.tpot_ms_min != r.tpot_ms_min:
        return "1"
    inside = r.tpot_ms_min <= r.tpot_ms_pred <= r.tpot_ms_max
    return f"{r.repeats}: {r.tpot_ms_min:.2f} .. {r.tpot_ms_max:.2f}{' (inside)' if inside else ''}"


def repeat_stats(runs: pd.DataFrame) -> dict | None:
    """Over the runs replayed more than once: how many, the TPOT spread ((max - min) / measured) median and
    max, and in how many the prediction lies within the measured range. None when no run was repeated."""
    rep = runs[(runs.repeats > 1) & runs.tpot_ms_min.notna()]
    if rep.empty:
        return None
    spread = (rep.tpot_ms_max - rep.tpot_ms_min) / rep.tpot_ms_meas
    inside = (rep.tpot_ms_min <= rep.tpot_ms_pred) & (rep.tpot_ms_pred <= rep.tpot_ms_max)
    return {
        "runs": len(rep),
        "spread_median": float(spread.median()),
        "spread_max": float(spread.max()),
        "inside": int(inside.sum()),
    }


def markdown(table: pd.DataFrame) -> str:
    runs = run_table(table)
    out = []
    groups = runs.groupby("model", sort=False) if "model" in runs else [("", runs)]
    for model, g in groups:
        if model:
            out.append(f"### {model}\n")
        out.append(
            "| policy | Cache | TPOT predicted ms | TPOT measured ms | error | prefill predicted ms | "
            "prefill measured ms | error | counters | decision ms / forward | host launch us profile / run | "
            "host memory GB/s CPU curve / run | CPU engine probe ms CPU curve / run | repeats: TPOT range ms |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for _, r in g.iterrows():
            out.append(
                f"| {r.policy} | {r.cache} | {r.tpot_ms_pred:.2f} | {r.tpot_ms_meas:.2f} | "
                f"{100 * r.tpot_ms_err:+.1f}% | {r.prefill_ms_pred:.1f} | {r.prefill_ms_meas:.1f} | "
                f"{100 * r.prefill_ms_err:+.1f}% | {'equal' if r.counters_equal else '**differ**'} | "
                f"{r.decision_ms:.2f} | {_profile_vs_run(r.launch_prof, r.launch_run)} | "
                f"{_profile_vs_run(r.mem_prof, r.mem_run)} | {_profile_vs_run(r.probe_prof, r.probe_run, 2)} | "
                f"{_repeats(r)} |"
            )
        out.append("")
        if model and runs.model.nunique() > 1:  # several models: each one's own errors and ordering as well
            s = error_stats(table[table.model == model])
            rank = ranking_agreement(g)
            out.append(
                f"{model}: TPOT median |error| {100 * s['median']:.1f}%, max {100 * s['max']:.1f}% over "
                f"{s['runs']} runs; the simulator orders {rank.agree} of {len(rank.pairs)} separable pairs "
                "alike.\n"
            )
    for name, met in (("TPOT", "tpot_ms"), ("prefill (TTFT forward)", "prefill_ms")):
        s = error_stats(table, met)
        out.append(
            f"- {name}: median |error| {100 * s['median']:.1f}%, max {100 * s['max']:.1f}% over {s['runs']} runs; "
            f"{s['within_5']} within 5%, {s['within_10']} within 10%."
        )
    s = error_stats(table)
    ok = s["median"] <= TARGET_MEDIAN and s["max"] <= TARGET_MAX
    out.append(
        f"- Targets (median <= {TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%}): "
        f"{'met' if ok else '**not met**'}."
    )
    rs = repeat_stats(runs)
    if rs is not None:
        out.append(
            f"- Repeats: {rs['runs']} runs replayed more than once (measured = the median repeat); TPOT spread "
            f"(max - min) / measured: median {100 * rs['spread_median']:.1f}%, max {100 * rs['spread_max']:.1f}%; "
            f"the prediction lies within the measured range in {rs['inside']} of them."
        )
    rank = ranking_agreement(runs)
    if rank.pairs:
        off = "; ".join(
            f"{p.faster} < {p.slower} ({p.model + ', ' if p.model else ''}Cache {p.cache})"
            for p in rank.disagreeing
        )
        out.append(
            f"- Ranking: of {len(rank.pairs)} pairs of policies whose measured TPOT ranges do not overlap (at one "
            f"model and cache), the simulator orders {rank.agree} the same way"
            + (f"; measured but not simulated: {off}." if off else ".")
        )
    for line in head_to_head(runs, "oled", "naive_lru"):
        out.append(f"- {line}")
    n_bad = int((~runs.counters_equal).sum())
    out.append(
        "- Counters (hits, demand copies, CPU experts, prefetch copies): "
        + ("equal in every run." if n_bad == 0 else f"**differ in {n_bad} runs**.")
    )
    return "\n".join(out) + "\n"


def load_forwards(paths) -> pd.DataFrame | None:
    """The per-forward tables behind fidelity tables or run directories, where they exist; else None."""
    from dllm_offload_sim.validate.run_store import RunStore, stored_forwards

    frames = []
    for p in map(Path, paths):
        d = p if p.is_dir() else p.parent
        f = RunStore(d).finished_forwards() if (d / "runs").is_dir() else None
        if f is None:
            # a re-predicted table's
            beside = p.with_name(f"{p.stem}_forwards.parquet") if p.is_file() else None
            f = pd.read_parquet(beside) if beside is not None and beside.is_file() else stored_forwards(d)
        if f is not None:
            frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else None


def load_layers(paths) -> pd.DataFrame | None:
    """The per-layer timelines behind run directories (``runs/*/layers.parquet``, or ``fidelity_layers.parquet``
    beside a table), where runs recorded them (``validate.layer_timeline``); else None."""
    from dllm_offload_sim.validate.run_store import RunStore

    frames = []
    for p in map(Path, paths):
        d = p if p.is_dir() else p.parent
        f = RunStore(d).finished_layers() if (d / "runs").is_dir() else None
        if f is None and (d / "fidelity_layers.parquet").is_file():
            f = pd.read_parquet(d / "fidelity_layers.parquet")
        if f is not None:
            frames.append(f)
    return pd.concat(frames, ignore_index=True) if frames else None


def _ms(v) -> str:
    return "" if v != v else f"{1e3 * v:.2f}"  # NaN (a column older runs lack) -> empty cell


def _delays(g: pd.DataFrame, col) -> str:
    """From submitting a layer's CPU job to the worker starting it / from its end to the host holding the
    result, summed per forward (empty for tables of older versions)."""
    start, back = col(g, "measured_cpu_start_delay_s"), col(g, "measured_cpu_return_delay_s")
    return "" if start != start else f"{_ms(start)} / {_ms(back)}"


def components(forwards: pd.DataFrame) -> str:
    """Mean per decode forward of each run: predicted and measured time and where it goes (ms)."""
    from dllm_offload_sim.traces.schema import PREFILL

    dec = forwards[forwards.phase != PREFILL]
    key = [k for k in ("model", "policy", "cache") if k in dec]
    col = lambda g, c: float(g[c].mean()) if c in g else float("nan")  # noqa: E731
    out = [
        "| policy | Cache | predicted ms | measured ms | gap ms | CPU path predicted ms | CPU path measured ms | "
        "GPU backlog ms | host routing-to-launch ms | host bookkeeping ms | host copy issue ms | host CPU-call issue ms | "
        "host prefetch issue ms | CPU worker start / hand-back delay ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    several = "model" in dec and dec["model"].nunique() > 1
    for k, g in dec.groupby(key, sort=False, dropna=False):  # older runs' tables lack the model column
        r = dict(zip(key, k))
        if several:  # name the shape beside the policy
            r["policy"] = f"{r['policy']} ({str(r['model']).removeprefix('llada2-')})"
        cpu = float(measured_cpu_path_s(g, "measured_").mean())
        pred, meas = col(g, "predicted_s"), col(g, "measured_s")
        out.append(
            f"| {r['policy']} | {r['cache']} | {_ms(pred)} | {_ms(meas)} | {_ms(meas - pred)} | "
            f"{_ms(col(g, 'predicted_cpu_path_s'))} | {_ms(cpu)} | {_ms(col(g, 'measured_gpu_backlog_s'))} | "
            f"{_ms(col(g, 'measured_host_issue_s'))} | {_ms(col(g, 'measured_bookkeeping_s'))} | "
            f"{_ms(col(g, 'measured_copy_issue_s'))} | {_ms(col(g, 'measured_cpu_issue_s'))} | "
            f"{_ms(col(g, 'measured_prefetch_issue_s'))} | {_delays(g, col)} |"
        )
    fits = forwards.groupby("model", sort=False) if "model" in forwards else [("", forwards)]
    for model, g in fits:
        fit = residual_fit(g)
        if fit is not None:
            out.append(
                f"\nResidual fit{' (' + str(model) + ')' if several else ''}: measured minus predicted time of a "
                f"decode forward, by least squares over the runs: {fit.describe()}."
            )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="dllm-report",
        description=__doc__,
        formatter_class=HelpFormatter,
        epilog="Example: dllm-report validation/h100/mini validation/h100/flash --out /tmp/fidelity.md",
    )
    p.add_argument("tables", nargs="+", help=TABLES_HELP)
    p.add_argument("--out", help="write the Markdown here (default: print it)")
    p.add_argument(
        "--profile",
        help="the profile the runs were predicted with (a path or a shipped name): adds the "
        "replay's host steps per MoE layer beside what it charges for them (validate.host_steps)",
    )
    a = p.parse_args(argv)
    table = load_tables_cli(a.tables)
    if table is None:
        return 2
    prof = None
    if a.profile:
        from dllm_offload_sim.costmodel.profile import ProfileError, load_profile

        try:
            prof = load_profile(a.profile)
        except (ProfileError, OSError) as e:
            print(f"error: --profile {a.profile}: {e}", file=sys.stderr)
            return 2
    text = markdown(table)
    forwards = load_forwards(a.tables)
    if forwards is not None:
        text += "\n### Where the time goes (decode forwards, mean per forward)\n\n" + components(forwards)
        if prof is not None:
            try:
                steps = host_steps_table(forwards, prof)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
            text += (
                "\n### The host's steps against the profile's charges (decode forwards)\n\n"
                "Each step's time in the replay over the run's decode forwards, against what the profile charges "
                "for it (measured with nothing else running); and what of a decode forward's gap (measured "
                "minus predicted) its CPU path does not explain.\n\n" + steps
            )
    layers = load_layers(a.tables)
    if layers is not None:
        text += (
            "\n### Per MoE layer (decode forwards, median per layer; runs with validate.layer_timeline)\n\n"
            + timeline_table(layers, forwards)
        )
        excess = cpu_excess_table(layers, forwards)
        if excess:
            text += (
                "\n### The CPU path's excess by the GPU work beside it (decode layers with a CPU call)\n\n"
                "The previous layer's end to the CPU path's end, measured minus predicted: median us (layers), by "
                "the GPU path the simulator runs beside the call. Flat across the bins: a cost per call while the GPU "
                "works; growing: one per copy or per unit of GPU work.\n\n" + excess
            )
        parts = cooperative_parts_table(layers, forwards)
        if parts:
            text += (
                "\n### The parts of a layer that runs both paths (decode layers with a CPU call and copies)\n\n"
                "From the previous layer's end: median us predicted / measured, and (in brackets) the median of "
                "measured minus predicted per layer. The simulated routing comes after the policy's decision and "
                "the layer's fixed host costs, the measured one (the GPU's event) before them. The CPU result "
                "waits behind the layer's copies; a late layer end follows whichever part is late.\n\n"
                + parts
            )
        fit = copies_fit_table(layers, forwards)
        if fit:
            text += (
                "\n### When a layer's copies land, by how many it copies (decode layers with copies)\n\n"
                "A least-squares line over the run's layers. A measured slope above the predicted one, with the "
                "rate after the host's last launch at the profile's, means host work that grows with the layer's "
                "misses starts the copies late; a rate above the profile's, a slower copy engine.\n\n" + fit
            )
    for d in (Path(p) for p in a.tables):
        drift = repeat_drift(d) if (d / "runs").is_dir() else None
        if drift is not None and not drift.empty:
            text += (
                f"\n### The CPU path over the sweep ({d.name}: every stored repeat, in the order they finished)\n\n"
                + "".join(f"- {line}\n" for line in drift_lines(drift))
                + "\n"
                + drift_table(drift)
            )
    if a.out:
        atomic_write_text(Path(a.out), text)
        print(f"wrote {a.out}")
    else:
        print(text, end="")
    return 0


cli = entry_point(main)  # console entry point ``dllm-report``


if __name__ == "__main__":
    cli()
