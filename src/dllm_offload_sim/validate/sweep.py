"""A validation sweep: every run's repeats replayed, in rounds across the runs, each repeat kept as it finishes.

A shared host's speed moves within minutes. A run whose repeats run back to back measures one spell of it, and
the next run another, so two runs can differ by the host's moves alone. Interleaved (``validate.interleave``, the
default), the sweep replays repeat 1 of every run, then repeat 2 of every run, and so on: each run's repeats sample
the host at times spread over the sweep, and its measured value (the median repeat) is less the mark of one spell.
Back to back (``false``) is the order of sweeps before the setting.

Every repeat is stored as it finishes (``RunStore.save_repeat``) with the decision time its run was charged, so an
interrupted sweep resumes from its stored repeats, simulating each unfinished run again with that charge (the same
inputs make the same simulation, whose schedule the replays follow). A run is marked done once its last repeat is
in; the sweep's table is written by the caller once every run is done, with the runs an earlier invocation
finished in the same directory under the same sweep (``earlier_runs``).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from dllm_offload_sim.runtime.host_experts import HostExperts
from dllm_offload_sim.runtime.replay_graphs import ReplayGraphs
from dllm_offload_sim.runtime.shared_cpu_engines import SharedCpuEngines
from dllm_offload_sim.validate.fidelity import FidelityRun, Replay, finish_run, plan_run, replay_once
from dllm_offload_sim.validate.run_store import RunStore


class SweepRun(NamedTuple):
    """One (policy, cache) of a sweep: its label, a maker of fresh policy objects, its cache and its run key."""

    label: str
    make_policy: Callable
    cache: int
    key: str


class SweepSettings(NamedTuple):
    """How a sweep replays its runs (``validate.*`` and ``hw.cpu_workers``)."""

    repeats: int = 1
    interleave: bool = True
    cpu_workers: int = 1
    n_real_layers: int = 1
    charge_policy_time: bool = True
    cpu_engine: str | None = None
    record_layers: bool = False
    device: str = "cuda"


class FinishedRun(NamedTuple):
    """A run of the sweep that an earlier invocation finished in the same directory: its label, cache and result."""

    label: str
    cache: int
    result: FidelityRun


def earlier_runs(store: RunStore, runs: list[SweepRun], key_of: Callable) -> list[FinishedRun]:
    """The finished runs in ``store`` that belong to the same sweep as ``runs`` but are not among them: an earlier
    invocation's into the same directory, such as another cache of a sweep split over several calls. ``key_of(label,
    cache)`` is the key this sweep gives such a run (None: a run it cannot have). In the store's order."""
    here = {(r.label, r.cache) for r in runs}
    out = []
    for label, cache, key in store.runs_of_sweep(key_of):
        done = None if (label, cache) in here else store.load(label, cache, key)
        if done is not None:
            out.append(
                FinishedRun(label, cache, FidelityRun(done[0], done[1], store.load_layers(label, cache)))
            )
    return out


def replay_order(n_runs: int, repeats: int, interleave: bool) -> list[tuple[int, int]]:
    """The (run, repeat) pairs in the order a sweep replays them: by rounds (every run's repeat 0, then every
    run's repeat 1, ...) when ``interleave``, else run by run."""
    if interleave:
        return [(i, k) for k in range(repeats) for i in range(n_runs)]
    return [(i, k) for i in range(n_runs) for k in range(repeats)]


def replay_to_store(rep: Replay, charge: tuple[float, float] | None) -> tuple[dict, dict]:
    """A repeat as ``RunStore.save_repeat`` keeps it: its tables (its per-layer stamps only where it recorded them),
    and the rest of it with its run's ``charge`` ((simulated, charged) decision time, None where none was charged)
    as JSON."""
    meta = {
        "summary": rep.summary,
        "host_launch_s": rep.host_launch_s,
        "cpu_engine": rep.cpu_engine,
        "setup_s": rep.setup_s,
        "replay_s": rep.replay_s,
        "finished_unix_s": rep.finished_unix_s,
        "charge": None if charge is None else list(charge),
    }
    # a per-layer timeline (validate.layer_timeline)
    recorded = rep.layers is not None and len(rep.layers) > 0
    return {"forwards": rep.per_forward, **({"layers": rep.layers} if recorded else {})}, meta


def replay_from_store(tables: dict, meta: dict) -> Replay:
    """A repeat as ``RunStore.load_repeats`` gives it back (what :func:`replay_to_store` made of it)."""
    return Replay(
        tables["forwards"],
        meta["summary"],
        float(meta["host_launch_s"]),
        tables.get("layers"),
        meta["cpu_engine"],
        float(meta["setup_s"]),
        float(meta["replay_s"]),
        float(meta.get("finished_unix_s", float("nan"))),
    )


def run_sweep(
    runs: list[SweepRun],
    store: RunStore,
    trace,
    cost,
    requests,
    settings: SweepSettings,
    on_replay: Callable | None = None,
    on_run: Callable | None = None,
) -> list[FidelityRun]:
    """Validate every run of ``runs`` on ``trace`` against ``cost`` (the runs finished under their keys in ``store``
    are loaded, not replayed); returns their results in ``runs``' order. ``on_replay(run, repeat, replay)`` is
    called after each repeat replayed here, ``on_run(i, result, resumed)`` once a run is complete (in the order
    they complete). The runs share one set of host experts, CPU engines and non-expert graphs."""
    s = settings
    if int(s.repeats) < 1:
        raise ValueError(f"run_sweep: repeats must be >= 1, got {s.repeats!r}")
    results: list[FidelityRun | None] = [None] * len(runs)
    replays: list[list[Replay]] = [[] for _ in runs]
    charges: list = [None] * len(runs)  # (simulated, charged) us per MoE layer of a run with stored repeats
    plans: list = [None] * len(runs)
    for i, r in enumerate(runs):
        done = store.load(r.label, r.cache, r.key)
        if done is not None:
            lay = store.load_layers(r.label, r.cache) if s.record_layers else None
            results[i] = FidelityRun(done[0], done[1], lay)
            if on_run is not None:
                on_run(i, results[i], True)
            continue
        stored = store.load_repeats(r.label, r.cache, r.key)[: s.repeats]
        replays[i] = [replay_from_store(t, m) for t, m in stored]
        if stored and stored[0][1].get("charge") is not None:
            charges[i] = tuple(stored[0][1]["charge"])

    def plan(i: int):
        r = runs[i]
        if plans[i] is None:
            plans[i] = plan_run(
                trace,
                r.make_policy,
                r.label,
                r.cache,
                cost,
                requests,
                s.cpu_workers,
                s.charge_policy_time,
                charge=charges[i],
                record_layers=s.record_layers,
            )
        return plans[i]

    def finish(i: int):
        r = runs[i]
        results[i] = finish_run(plan(i), replays[i])
        store.save(r.label, r.cache, r.key, *results[i])
        plans[i] = None  # its simulation is no longer needed
        if on_run is not None:
            on_run(i, results[i], False)

    host = graphs = None
    engines = SharedCpuEngines()  # every run of the sweep lends its CPU engine from here
    try:
        for i, k in replay_order(len(runs), int(s.repeats), s.interleave):
            if results[i] is not None or k < len(replays[i]):
                continue
            r, p = runs[i], plan(i)
            host = host or HostExperts(
                trace.topology, n_real_layers=s.n_real_layers, pin=torch.device(s.device).type == "cuda"
            )
            graphs = graphs or ReplayGraphs(
                trace.topology, s.device
            )  # captured by the first run that replays
            rep = replay_once(p, host, engines, graphs, s.device, s.n_real_layers, s.cpu_engine)
            charge = (p.simulated, p.charged) if s.charge_policy_time else None
            store.save_repeat(r.label, r.cache, r.key, k, *replay_to_store(rep, charge))
            replays[i].append(rep)
            if on_replay is not None:
                on_replay(r, k, rep)
            if len(replays[i]) == s.repeats:
                finish(i)
        for i in range(len(runs)):  # runs whose every repeat was stored before an interruption
            if results[i] is None:
                finish(i)
    finally:
        engines.close()
        if graphs is not None:
            graphs.close()
    return results
