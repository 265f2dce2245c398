"""LLaDA2Config: the checkpoint's config.json keys the model needs (those of the HF LLaDA2.0 checkpoints)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from dllm_offload_sim.traces.topology import ModelTopology


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded: names the file and the key or tensor."""


# config.json keys the model reads no field for but whose value changes the architecture: the values it
# implements (any other is refused, never silently ignored)
IMPLEMENTED_ONLY = {
    "use_qk_norm": (True,),
    "rope_scaling": (None,),
    "moe_router_enable_expert_bias": (True,),
    "score_function": ("sigmoid",),
}


@dataclass
class LLaDA2Config:
    """Architecture of a LLaDA2.0/2.1 MoE checkpoint (defaults: LLaDA2.0-mini)."""

    vocab_size: int = 157184
    hidden_size: int = 2048
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 5120
    moe_intermediate_size: int = 512
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8
    topk_group: int = 4
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    rope_theta: float = 600000.0
    partial_rotary_factor: float = 0.5
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 16384
    pad_token_id: int = 156892
    mask_token_id: int = 156895
    eos_token_id: int = 156892

    @classmethod
    def from_json(cls, path) -> "LLaDA2Config":
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (a checkpoint directory needs config.json)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from None
        for key, allowed in IMPLEMENTED_ONLY.items():
            if key in d and d[key] not in allowed:
                raise CheckpointError(
                    f"{path}: {key}={d[key]!r} is not implemented by this model (it implements "
                    f"{key} = {' or '.join(repr(a) for a in allowed)}); refusing to load it as if it were"
                )
        known = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in known})
        if "head_dim" not in d and "hidden_size" in d:
            cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        bad = [
            f"{k}={getattr(cfg, k)}"
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "num_experts",
                "num_experts_per_tok",
                "num_attention_heads",
            )
            if getattr(cfg, k) <= 0
        ]
        if cfg.num_experts % cfg.n_group or cfg.num_attention_heads % cfg.num_key_value_heads:
            bad.append("num_experts % n_group and num_attention_heads % num_key_value_heads must be 0")
        if bad:
            raise CheckpointError(f"{path}: invalid values: {', '.join(bad)}")
        return cfg

    def to_json(self, path) -> None:
        Path(path).write_text(
            json.dumps(
                {**asdict(self), "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe"}, indent=2
            )
        )

    def topology(self, name: str = "llada2-checkpoint", dtype: str = "bf16") -> ModelTopology:
        return ModelTopology(
            name=name,
            n_layers=self.num_hidden_layers,
            moe_layers=tuple(range(self.first_k_dense_replace, self.num_hidden_layers)),
            n_experts=self.num_experts,
            top_k=self.num_experts_per_tok,
            n_group=self.n_group,
            topk_group=self.topk_group,
            hidden=self.hidden_size,
            moe_intermediate=self.moe_intermediate_size,
            dtype=dtype,
            n_shared_experts=self.num_shared_experts,
            n_heads=self.num_attention_heads,
            n_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            dense_intermediate=self.intermediate_size,
        )
