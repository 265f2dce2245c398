"""Build a run's objects from its config, and fingerprint the config so a finished run is known as such.

``conf/config.yaml`` (the simulator) and ``conf/validate.yaml`` (the validator) compose the same groups:
``model/`` (a topology preset), ``trace/`` (a path or shipped name, requests), ``hw/`` (a
:class:`wiring.hardware.Hardware`), ``policy/`` (a policy class and its parameters).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from dllm_offload_sim.costmodel.cost_model import CostModel
from dllm_offload_sim.costmodel.profile import ProfileError
from dllm_offload_sim.policies.base import Policy
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.schema import META_FILE, TABLE_FILES
from dllm_offload_sim.traces.shipped import resolve_trace
from dllm_offload_sim.wiring.errors import ConfigError
from dllm_offload_sim.wiring.hardware import Hardware

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
USER_POLICY_DIR = (
    Path("conf") / "policy"
)  # the working folder's own policy configs (relative: the folder of now)
DEFAULT_CACHE = 40  # GPU expert slots per MoE layer when a single-policy run names none


def _instantiate(node, what: str):
    from hydra.utils import instantiate

    try:
        return instantiate(node, _convert_="all")
    except ConfigError:
        raise
    except Exception as e:  # hydra wraps constructor errors; surface the object's own message
        cause = e.__cause__ or e
        if isinstance(cause, ConfigError):
            raise cause from None
        raise ConfigError(f"cannot build {what} from {OmegaConf.to_container(node)}: {cause}") from None


# installed packages register policies here: name = "module:Class"
POLICY_ENTRY_POINTS = "dllm_offload_sim.policies"
FORMER_POLICY_NAMES = {"ideal": "clairvoyant_coop"}  # a shipped policy's former name -> its name now


def _registered_policies() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep.value.replace(":", ".") for ep in entry_points(group=POLICY_ENTRY_POINTS)}


def _policy_folders(dirs) -> list[Path]:
    """Where policy configs are looked up, in order: the shipped ones, the working folder's ``conf/policy`` (as
    ``dllm-sim policy=NAME`` finds it), then ``dirs`` (``policy_dirs``)."""
    return [CONF_DIR / "policy", USER_POLICY_DIR, *map(Path, dirs)]


def policy_names(dirs=()) -> list[str]:
    """Every policy a name can pick: ``conf/policy/NAME.yaml`` shipped or in the working folder, ``NAME.yaml`` in
    ``dirs`` (``policy_dirs``), and those installed packages register under the ``dllm_offload_sim.policies``
    entry-point group."""
    names = {p.stem for d in _policy_folders(dirs) for p in Path(d).glob("*.yaml")}
    return sorted(names | set(_registered_policies()))


def policy_label(pcfg, dirs=()) -> str:
    """The name a policy config goes by where Hydra did not record the choice (a config composed through the Python
    API): the policy whose config it is, else the class's last dotted name."""
    want = OmegaConf.to_container(pcfg, resolve=True)
    for name in policy_names(dirs):
        try:
            if OmegaConf.to_container(policy_config(name, dirs), resolve=True) == want:
                return name
        except ConfigError:
            continue
    return str(want.get("_target_", "policy")).rsplit(".", 1)[-1]


def policy_config(name: str, dirs=()) -> DictConfig:
    """The config of policy ``name`` (see :func:`policy_names`; the shipped ones first, then ``dirs``, then the
    entry points; a shipped policy's former name, as runs stored before its rename carry it, names it too); an
    unknown name is a clear error."""
    name = FORMER_POLICY_NAMES.get(name, name)
    for d in _policy_folders(dirs):
        f = Path(d) / f"{name}.yaml"
        if f.is_file():
            return OmegaConf.load(f)
    target = _registered_policies().get(name)
    if target is not None:
        return OmegaConf.create({"_target_": target})
    raise ConfigError(
        f"unknown policy {name!r}; known: {', '.join(policy_names(dirs))} (a policy of your own: "
        f"its NAME.yaml in a folder of policy_dirs, or a '{POLICY_ENTRY_POINTS}' entry point)"
    )


def make_policy(pcfg) -> Policy:
    """A new policy object from its config (``_target_`` and parameters). A class whose module is nowhere on the
    import path but in the working folder (``mypolicies/fifo.py`` for ``mypolicies.fifo.FIFOPolicy``) is found
    there, as ``python -m`` would find it: the working folder joins the end of the import path."""
    top = str(OmegaConf.select(pcfg, "_target_") or "").split(".")[0]
    if top and importlib.util.find_spec(top) is None and (Path(top).is_dir() or Path(f"{top}.py").is_file()):
        sys.path.append(os.getcwd())
    return _instantiate(pcfg, "policy")


def hardware(cfg) -> Hardware:
    """The run's machine, from ``cfg.hw``."""
    return _instantiate(cfg.hw, "hw")


def cost_model(cfg) -> CostModel:
    """The cost model of the run's machine (its profile, with any override)."""
    return hardware(cfg).cost_model()


def load_trace(cfg) -> Trace:
    """The run's trace (``cfg.trace.path``: a directory or a shipped name; validated on open). With
    ``model=auto`` (the default) ``cfg.model.shape`` becomes the preset the trace's topology matches, so the
    profile follows it (``hw.profile``: ``<hw.name>-<model.shape>``)."""
    path = resolve_trace(cfg.trace.path)
    if OmegaConf.select(cfg, "fig_traces") is not None and not path.exists():  # a paper experiment's trace
        raise ConfigError(
            f"{path}: no such trace directory; the paper's figure experiments read traces that "
            f"`dllm-synth --figure-traces --out {OmegaConf.select(cfg, 'fig_traces')}` writes (fig_traces, or the "
            f"DLLM_FIG_TRACES environment variable, names their folder)"
        )
    trace = Trace.open(path)
    if OmegaConf.select(cfg, "model.shape") == "auto":
        OmegaConf.update(cfg, "model.shape", shape_of(trace))
    return trace


def shape_of(trace: Trace) -> str:
    """The catalogue model (its file's stem: ``mini``, ``flash``, ``qwen3-30b-a3b``, ...) whose routing topology and
    expert size the trace has; of several, the one whose name the trace records."""
    from dllm_offload_sim.traces.catalogue import catalogue

    t = trace.topology
    key = ("n_experts", "top_k", "moe_layers", "expert_bytes")
    models = catalogue()
    same = [m for m in models if all(getattr(m.topology, f) == getattr(t, f) for f in key)]
    if same:
        return next((m for m in same if m.name == t.name), same[0]).path.stem
    diffs = {
        m.path.stem: [
            f"{f}={getattr(t, f)} where it has {getattr(m.topology, f)}"
            for f in ("n_experts", "top_k", "n_moe_layers", "expert_bytes")
            if getattr(t, f) != getattr(m.topology, f)
        ]
        for m in models
    }
    near = min(diffs, key=lambda n: len(diffs[n]))
    raise ConfigError(
        f"trace {trace.path} has topology {t.name} ({len(t.moe_layers)} MoE layers, {t.n_experts} experts of "
        f"{t.expert_bytes} bytes, top-{t.top_k}), which matches no catalogue model (closest, {near}: "
        f"{'; '.join(diffs[near])}); declare it in a model file of your own and pass model.shape=FILE and "
        f"hw.profile= for it (docs/models.md)"
    )


def inputs_fingerprint(cfg) -> dict:
    """Content hashes of the files a run reads (the trace's meta.json and tables, the profile), so that a finished
    run is not taken as current when its inputs changed under the same config."""
    out = {}
    try:
        tpath = resolve_trace(cfg.trace.path)
        h = hashlib.sha256()
        for name in (META_FILE, *TABLE_FILES):
            f = tpath / name
            h.update(name.encode())
            if f.is_file():
                with open(f, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
        out["trace"] = h.hexdigest()[:16]
        out["profile"] = hashlib.sha256(hardware(cfg).profile_path.read_bytes()).hexdigest()[:16]
    except (OSError, ProfileError, ConfigError):
        pass  # a missing input fails later with its own message
    return out


def config_hash(cfg, salt: str = "") -> str:
    """A short hash of the resolved config and its inputs' contents (``quiet``, ``overwrite`` and ``table.jobs``
    left out: they do not change the results), and ``salt`` (what else the results depend on, e.g. the simulator's
    model version)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    if salt:
        c["_salt"] = salt
    c.pop("quiet", None)
    c.pop("overwrite", None)
    c.get("table", {}).pop("jobs", None)
    c["_inputs"] = inputs_fingerprint(cfg)
    return hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:16]


def int_field(name: str, value, minimum: int | None = None) -> int:
    """``value`` of config field ``name`` as an int; a float, bool, string or anything below ``minimum`` is a
    :class:`ConfigError` naming the field and value (``cache=40.5`` is not silently 40)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def int_list_field(name: str, value, minimum: int | None = None) -> list[int]:
    """``value`` of config field ``name`` as a list of distinct ints (``[0, 0]`` would replay a request twice)."""
    from omegaconf import ListConfig

    if not isinstance(value, (list, tuple, ListConfig)):
        raise ConfigError(f"{name} must be a list such as [0, 1], got {value!r}")
    out = [int_field(f"{name}[{i}]", v, minimum) for i, v in enumerate(value)]
    dup = sorted({v for v in out if out.count(v) > 1})
    if dup:
        raise ConfigError(f"{name} lists {dup} more than once: {list(value)}")
    return out


def requested_ids(cfg, trace: Trace, key: str = "trace.requests") -> list[int]:
    """The request ids a run replays: ``cfg``'s ``key`` (null: every request of ``trace``)."""
    node = OmegaConf.select(cfg, key)
    return trace.request_ids if node is None else int_list_field(key, node, 0)
