"""The model catalogue: one YAML file per MoE model, with the shape facts the simulator and the cost model need and
the published configuration they come from.

Shipped files live in ``traces/catalogue/``; a model of one's own is a file of the same fields anywhere, named by its
path (``model.shape=path/to/mymodel.yaml``, ``dllm-synth --model path/to/mymodel.yaml``). Fields:

- ``name`` (the topology's name, recorded in traces), ``aliases`` (other names that pick it), ``decoding``
  (``block-diffusion`` or ``autoregressive``), ``source`` (the configuration's address), ``router`` and
  ``attention`` (what they are, in words);
- the shape: ``n_layers``, ``first_dense_layers`` (the leading layers with a dense MLP; every later layer is MoE) or
  ``moe_layers`` (their ids), ``n_experts``, ``top_k``, ``n_group`` and ``topk_group`` (group-limited routing; 1 and
  1 without it), ``n_shared_experts``, ``hidden``, ``moe_intermediate`` (one expert's width),
  ``dense_intermediate``, ``n_heads``, ``n_kv_heads``, ``head_dim``, ``vocab_size``, ``dtype``.

A file that cannot be read, lacks a field or holds a bad value is a :class:`TraceError` naming the file and field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.topology import ModelTopology

CATALOGUE_DIR = Path(__file__).resolve().parent / "catalogue"
DECODINGS = ("block-diffusion", "autoregressive")
DESCRIPTION_FIELDS = ("name", "aliases", "decoding", "source", "router", "attention")
LAYER_FIELDS = ("first_dense_layers", "moe_layers")
SHAPE_FIELDS = tuple(f.name for f in fields(ModelTopology) if f.name not in ("name", "moe_layers"))


@dataclass(frozen=True)
class CatalogueModel:
    """One model of the catalogue: its topology, where its shape comes from and how it decodes."""

    topology: ModelTopology
    aliases: tuple[str, ...]
    decoding: str
    source: str
    router: str
    attention: str
    path: Path

    @property
    def name(self) -> str:
        return self.topology.name

    def names(self) -> tuple[str, ...]:
        """Every name that picks this model: its name, its file's stem and its aliases."""
        return (self.name, self.path.stem, *self.aliases)


def load_model_file(path: str | Path) -> CatalogueModel:
    """A catalogue file (shipped or one's own) read and checked."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(f"model file {path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise TraceError(f"model file {path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise TraceError(f"model file {path}: expected a mapping of fields, got {type(raw).__name__}")
    known = set(DESCRIPTION_FIELDS) | set(LAYER_FIELDS) | set(SHAPE_FIELDS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TraceError(
            f"model file {path}: unknown field {unknown[0]!r}; fields: {', '.join(sorted(known))}"
        )
    required = ("name", "decoding", "source", "n_layers", "n_experts", "top_k", "hidden", "moe_intermediate")
    missing = [f for f in required if f not in raw]
    if missing:
        raise TraceError(f"model file {path}: missing field {missing[0]!r} (required: {', '.join(required)})")
    if raw["decoding"] not in DECODINGS:
        raise TraceError(f"model file {path}: decoding={raw['decoding']!r}; one of {', '.join(DECODINGS)}")
    if ("first_dense_layers" in raw) == ("moe_layers" in raw):
        raise TraceError(f"model file {path}: give exactly one of first_dense_layers and moe_layers")
    n_layers = raw["n_layers"]
    if "moe_layers" in raw:
        moe_layers = raw["moe_layers"]
    else:
        first = raw["first_dense_layers"]
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise TraceError(f"model file {path}: first_dense_layers={first!r} must be an integer >= 0")
        moe_layers = list(range(first, n_layers)) if isinstance(n_layers, int) else []
    aliases = raw.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise TraceError(f"model file {path}: aliases={aliases!r} must be a list of names")
    shape = {f: raw[f] for f in SHAPE_FIELDS if f in raw}
    try:
        topo = ModelTopology(name=str(raw["name"]), moe_layers=tuple(moe_layers), **shape)
    except TraceError as e:
        raise TraceError(f"model file {path}: {e}") from None
    except TypeError as e:
        raise TraceError(f"model file {path}: {e}") from None
    return CatalogueModel(
        topo,
        tuple(aliases),
        raw["decoding"],
        str(raw["source"]),
        str(raw.get("router", "")),
        str(raw.get("attention", "")),
        path,
    )


def catalogue() -> list[CatalogueModel]:
    """Every shipped model, in file-name order."""
    return [load_model_file(p) for p in sorted(CATALOGUE_DIR.glob("*.yaml"))]


def find_model(name: str) -> CatalogueModel:
    """The model ``name`` picks: a path to a model file of one's own (``.yaml``/``.yml``), else a shipped model's
    name, file stem or alias (case-insensitive)."""
    if str(name).endswith((".yaml", ".yml")):
        return load_model_file(name)
    own = CATALOGUE_DIR / f"{name}.yaml"
    if own.is_file():  # a shipped file's own name: read that file alone
        return load_model_file(own)
    want = str(name).lower()
    models = catalogue()
    for m in models:
        if want in (n.lower() for n in m.names()):
            return m
    known = ", ".join(m.path.stem for m in models)
    raise TraceError(
        f"unknown model {name!r}; the catalogue has {known} (aliases too: mini, flash, ...), or name a model file "
        f"of your own (path/to/model.yaml; docs/models.md)"
    )


def model_file_text(
    topo: ModelTopology, decoding: str, source: str, router: str = "", attention: str = ""
) -> str:
    """``topo`` as a model file (the catalogue's format), which :func:`load_model_file` reads back as ``topo``."""
    lines = [
        f"# {topo.name}: written by dllm-offload-sim from {source}",
        f"name: {topo.name}",
        f"decoding: {decoding}",
        f"source: {source}",
        f"router: {router or 'unknown'}",
        f"attention: {attention or 'unknown'}",
        f"n_layers: {topo.n_layers}",
        f"moe_layers: [{', '.join(str(i) for i in topo.moe_layers)}]",
    ]
    lines += [f"{f}: {getattr(topo, f)}" for f in SHAPE_FIELDS if f != "n_layers"]
    return "\n".join(lines) + "\n"
