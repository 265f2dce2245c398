"""Per-run results of a validation sweep, so that an interrupted sweep resumes where it stopped.

Each (policy, cache) run writes ``runs/<policy>_c<cache>/`` with ``rows.parquet`` (fidelity rows),
``forwards.parquet`` (predicted vs measured per forward), with ``validate.layer_timeline`` ``layers.parquet``
(per MoE layer), and, last, ``done.json`` holding the run's
key (a hash of everything that determines it: config, trace and profile contents, policy, cache).
A run directory without a matching ``done.json`` is redone; the sweep's ``fidelity.parquet`` is
written only once every run is done, so partial results are never mistaken for a complete table.

A run's repeats are kept as they finish, under ``runs/<policy>_c<cache>/repeats/``: ``<k>_<table>.parquet`` and,
last, ``<k>.json`` (the run's key and what the repeat measured besides its tables). An interrupted sweep resumes
a run from its stored repeats; a repeat is taken only if every repeat before it is stored under the same key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd

from dllm_offload_sim.traces.atomic import atomic_write_json, atomic_write_parquet


def digest(obj) -> str:
    """A short hash of ``obj`` written as canonical JSON (sorted keys; what JSON cannot hold, as its ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_key(sweep_key: str, label: str, policy_cfg, cache: int) -> str:
    """Hash of one run's identity: the sweep's inputs, the policy's name and parameters, the cache."""
    return digest({"sweep": sweep_key, "policy": label, "policy_cfg": policy_cfg, "cache": int(cache)})


class RunStore:
    """Finished runs of one sweep under ``root/runs``: load a run whose key matches, save a new one."""

    def __init__(self, root: Path):
        self.root = Path(root) / "runs"

    def _dir(self, label: str, cache: int) -> Path:
        return self.root / f"{label}_c{int(cache)}"

    def load(self, label: str, cache: int, key: str) -> tuple[list[dict], pd.DataFrame] | None:
        """The run's (rows, forwards) if it finished under ``key``; None if it must be (re)done."""
        d = self._dir(label, cache)
        try:
            if json.loads((d / "done.json").read_text()).get("key") != key:
                return None
            return pd.read_parquet(d / "rows.parquet").to_dict("records"), pd.read_parquet(
                d / "forwards.parquet"
            )
        except (OSError, ValueError):
            return None  # missing or unreadable: redo the run

    def save(
        self,
        label: str,
        cache: int,
        key: str,
        rows: list[dict],
        forwards: pd.DataFrame,
        layers: pd.DataFrame | None = None,
    ) -> None:
        """Write the run's tables (and its per-layer timeline, where recorded), then mark it done."""
        d = self._dir(label, cache)
        d.mkdir(parents=True, exist_ok=True)
        (d / "done.json").unlink(missing_ok=True)
        atomic_write_parquet(d / "rows.parquet", pd.DataFrame(rows))
        atomic_write_parquet(d / "forwards.parquet", forwards)
        if layers is not None:
            atomic_write_parquet(d / "layers.parquet", layers)
        atomic_write_json(d / "done.json", {"key": key, "policy": label, "cache": int(cache)})

    def save_repeat(
        self, label: str, cache: int, key: str, k: int, tables: dict[str, pd.DataFrame], meta: dict
    ) -> None:
        """Keep repeat ``k`` of a run: its ``tables`` (name -> table), then its ``meta`` with the run's key."""
        d = self._dir(label, cache) / "repeats"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{k}.json").unlink(missing_ok=True)
        for name, t in tables.items():
            atomic_write_parquet(d / f"{k}_{name}.parquet", t)
        atomic_write_json(d / f"{k}.json", {**meta, "key": key, "repeat": int(k), "tables": sorted(tables)})

    def load_repeats(self, label: str, cache: int, key: str) -> list[tuple[dict[str, pd.DataFrame], dict]]:
        """The run's stored repeats 0, 1, ... under ``key`` as (tables, meta), up to the first one missing,
        unreadable or stored under another key."""
        d, out = self._dir(label, cache) / "repeats", []
        while True:
            k = len(out)
            try:
                meta = json.loads((d / f"{k}.json").read_text())
                if meta.get("key") != key:
                    return out
                out.append(({n: pd.read_parquet(d / f"{k}_{n}.parquet") for n in meta["tables"]}, meta))
            except (OSError, ValueError, KeyError, TypeError):
                return out

    def finished_runs(self) -> list[tuple[str, int, str | None, Path]]:
        """(policy, cache, key, directory) of every finished run (a ``done.json``), in the directories' order."""
        out = []
        for done in sorted(self.root.glob("*/done.json")):
            label, cache = done.parent.name.rsplit("_c", 1)
            try:
                key = json.loads(done.read_text()).get("key")
            except (OSError, ValueError) as e:
                raise ValueError(f"{done}: unreadable ({e})") from e
            out.append((label, int(cache), key, done.parent))
        return out

    def runs_of_sweep(self, key_of) -> list[tuple[str, int, str]]:
        """(policy, cache, key) of the finished runs that belong to a sweep: those whose stored key is
        ``key_of(policy, cache)``, the key that sweep gives such a run (None: a run it cannot have)."""
        out = []
        for label, cache, key, _ in self.finished_runs():
            if key is not None and key == key_of(label, cache):
                out.append((label, cache, key))
        return out

    def load_layers(self, label: str, cache: int) -> pd.DataFrame | None:
        """The per-layer timeline of a finished run, or None where it recorded none."""
        try:
            return pd.read_parquet(self._dir(label, cache) / "layers.parquet")
        except (OSError, ValueError):
            return None

    def finished_rows(self) -> pd.DataFrame | None:
        """Fidelity rows of every run that finished (whatever its key); None if none did."""
        return self._finished("rows.parquet")

    def finished_forwards(self) -> pd.DataFrame | None:
        """Predicted vs measured per forward of every run that finished; None if none did."""
        return self._finished("forwards.parquet")

    def finished_layers(self) -> pd.DataFrame | None:
        """The per-layer timelines of the finished runs that recorded one; None if none did."""
        return self._finished("layers.parquet", where_recorded=True)

    def _finished(self, name: str, where_recorded: bool = False) -> pd.DataFrame | None:
        files = [f.parent / name for f in sorted(self.root.glob("*/done.json"))]
        if where_recorded:
            files = [f for f in files if f.is_file()]
        if not files:
            return None
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def stored_rows(run_dir: Path) -> pd.DataFrame | None:
    """The fidelity rows of a run directory's finished runs: from ``runs/`` where the sweep's store is there, else the
    sweep's merged ``fidelity.parquet`` (a run directory kept as evidence without its per-run store, as under
    ``validation/``); None if neither."""
    return _stored(Path(run_dir), "rows.parquet", "fidelity.parquet")


def stored_forwards(run_dir: Path) -> pd.DataFrame | None:
    """The per-forward tables of a run directory's finished runs, found as :func:`stored_rows` finds the rows
    (``runs/*/forwards.parquet``, else ``fidelity_forwards.parquet``); None if neither."""
    return _stored(Path(run_dir), "forwards.parquet", "fidelity_forwards.parquet")


def _stored(run_dir: Path, per_run: str, merged: str) -> pd.DataFrame | None:
    table = RunStore(run_dir)._finished(per_run) if (run_dir / "runs").is_dir() else None
    if table is None and (run_dir / merged).is_file():
        table = pd.read_parquet(run_dir / merged)
    return table
