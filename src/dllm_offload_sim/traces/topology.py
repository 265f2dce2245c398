"""Model topology: the shape facts of a LLaDA2-style MoE model that traces, costs and policies need."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dllm_offload_sim.traces.errors import TraceError

BYTES_PER_DTYPE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}


@dataclass(frozen=True)
class ModelTopology:
    """The routing and size facts of an MoE model (which layers are MoE, experts, top-k, widths)."""

    name: str
    n_layers: int  # decoder layers, dense ones included
    moe_layers: tuple[int, ...]  # ids of the MoE layers, in model numbering
    n_experts: int  # routed experts per MoE layer
    top_k: int  # experts per token
    n_group: int  # expert groups for group-limited routing
    topk_group: int  # groups kept per token
    hidden: int  # hidden size
    moe_intermediate: int  # per-expert FFN width
    dtype: str = "bf16"
    n_shared_experts: int = 1
    n_heads: int = 16
    n_kv_heads: int = 4
    head_dim: int = 128
    vocab_size: int = 157184
    dense_intermediate: int = 5120

    def __post_init__(self):
        problems = []
        for name in (
            "n_layers",
            "n_experts",
            "top_k",
            "n_group",
            "topk_group",
            "hidden",
            "moe_intermediate",
            "n_shared_experts",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "vocab_size",
            "dense_intermediate",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                problems.append(f"{name}={v!r} must be an integer")
        if not isinstance(self.moe_layers, (list, tuple)) or any(
            isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in self.moe_layers
        ):
            problems.append(f"moe_layers={self.moe_layers!r} must be a list of integers")
        if problems:
            raise TraceError(f"invalid model topology {self.name!r}: " + "; ".join(problems))
        object.__setattr__(self, "moe_layers", tuple(int(x) for x in self.moe_layers))
        for name in ("n_layers", "n_experts", "top_k", "n_group", "topk_group", "hidden", "moe_intermediate"):
            if int(getattr(self, name)) <= 0:
                problems.append(f"{name}={getattr(self, name)} must be > 0")
        if self.top_k > self.n_experts:
            problems.append(f"top_k={self.top_k} exceeds n_experts={self.n_experts}")
        if self.n_experts % max(self.n_group, 1):
            problems.append(f"n_experts={self.n_experts} not divisible by n_group={self.n_group}")
        if self.topk_group > self.n_group:
            problems.append(f"topk_group={self.topk_group} exceeds n_group={self.n_group}")
        if not self.moe_layers:
            problems.append("moe_layers is empty")
        elif min(self.moe_layers) < 0 or max(self.moe_layers) >= self.n_layers:
            problems.append(f"moe_layers {list(self.moe_layers)} outside 0..{self.n_layers - 1}")
        elif len(set(self.moe_layers)) != len(self.moe_layers) or list(self.moe_layers) != sorted(
            self.moe_layers
        ):
            problems.append("moe_layers must be strictly increasing")
        if self.dtype not in BYTES_PER_DTYPE:
            problems.append(f"dtype={self.dtype!r} not one of {sorted(BYTES_PER_DTYPE)}")
        if problems:
            raise TraceError(f"invalid model topology {self.name!r}: " + "; ".join(problems))

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def expert_bytes(self) -> int:
        """Bytes of one routed expert's weights in the model dtype."""
        return self.expert_params * BYTES_PER_DTYPE[self.dtype]

    @property
    def expert_flops_per_token(self) -> int:
        """Multiply-add FLOPs (2 per MAC) of one token through one expert."""
        return 2 * self.expert_params

    def to_dict(self) -> dict:
        d = asdict(self)
        d["moe_layers"] = list(self.moe_layers)
        d["expert_bytes"] = self.expert_bytes
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "ModelTopology":
        known = {f for f in cls.__dataclass_fields__}
        missing = [
            f
            for f in (
                "name",
                "n_layers",
                "moe_layers",
                "n_experts",
                "top_k",
                "n_group",
                "topk_group",
                "hidden",
                "moe_intermediate",
            )
            if f not in d
        ]
        if missing:
            raise TraceError(f"model topology lacks fields {missing}")
        return cls(**{k: v for k, v in d.items() if k in known})

    def with_widths(self, **kw) -> "ModelTopology":
        """A copy with some fields replaced (e.g. a tiny-width model of the same routing)."""
        d = asdict(self)
        d.update(kw)
        return ModelTopology(**d)


def topology_preset(name: str) -> ModelTopology:
    """The topology of the catalogue model ``name`` (``mini``, ``flash``, ``qwen3-30b-a3b``, ... or a model file of
    one's own; :mod:`traces.catalogue`)."""
    from dllm_offload_sim.traces.catalogue import find_model

    return find_model(name).topology


def __getattr__(name: str) -> ModelTopology:
    """``MINI`` and ``FLASH``: LLaDA2.0-mini's and -flash's topologies, read from the catalogue when first named."""
    if name in ("MINI", "FLASH"):
        return topology_preset(name.lower())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
