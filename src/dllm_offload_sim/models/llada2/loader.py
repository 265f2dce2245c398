"""Load an HF-format LLaDA2 checkpoint directory (config.json + *.safetensors) by parameter name."""

from __future__ import annotations

from pathlib import Path

import torch

from dllm_offload_sim.traces.atomic import atomic_directory
from dllm_offload_sim.models.llada2.config import CheckpointError, LLaDA2Config
from dllm_offload_sim.models.llada2.modeling import LLaDA2MoeModelLM


def load_checkpoint(path, device="cpu", dtype=torch.float32) -> LLaDA2MoeModelLM:
    """Build the model from ``path/config.json`` and fill every tensor from the safetensors shards.

    A tensor the model needs that no shard holds, or one whose shape differs, is an error naming the
    tensor and the file; unexpected tensors are an error too (a sign of a different architecture).
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    cfg = LLaDA2Config.from_json(path / "config.json")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{path}: no *.safetensors shards")
    with torch.device("meta"):
        model = LLaDA2MoeModelLM(cfg)
    want = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    state, where = {}, {}
    for f in shards:
        try:
            _read_shard(f, safe_open, want, state, where)
        except CheckpointError:
            raise
        except Exception as e:  # safetensors' own error types: a truncated or corrupt shard
            raise CheckpointError(
                f"{f}: cannot be read as safetensors ({e}); the file is truncated or corrupt, copy it again"
            ) from None
    missing = sorted(set(want) - set(state))
    if missing:
        raise CheckpointError(
            f"{path}: missing tensor '{missing[0]}'"
            + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
        )
    model = LLaDA2MoeModelLM(cfg).to(device=device, dtype=dtype)
    for k, v in state.items():  # the routers' expert bias keeps the checkpoint's dtype (as dInfer keeps it)
        if k.endswith("expert_bias"):
            owner = model.get_submodule(k.rsplit(".", 1)[0])
            owner.register_buffer("expert_bias", torch.empty(v.shape, dtype=v.dtype, device=device))
    model.load_state_dict(
        {
            k: v.to(dtype) if v.is_floating_point() and not k.endswith("expert_bias") else v
            for k, v in state.items()
        },
        strict=True,
    )
    return model.eval()


def save_checkpoint(model: LLaDA2MoeModelLM, path, shard_bytes: int = 1 << 30) -> Path:
    """Write ``model`` as config.json + safetensors shards (HF layout), atomically: ``path`` appears only
    complete, and replaces only an earlier checkpoint (a folder holding config.json) or an empty folder."""
    with atomic_directory(Path(path), overwrite=True, marker="config.json", what="checkpoint") as tmp:
        _write_checkpoint(model, tmp, shard_bytes)
    return Path(path)


def _write_checkpoint(model: LLaDA2MoeModelLM, path: Path, shard_bytes: int) -> None:
    from safetensors.torch import save_file

    model.config.to_json(path / "config.json")
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    shards, cur, size = [], {}, 0
    for k, v in sd.items():
        nb = v.numel() * v.element_size()
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += nb
    shards.append(cur)
    for i, s in enumerate(shards):
        save_file(s, str(path / f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"))


def _read_shard(f, safe_open, want: dict, state: dict, where: dict) -> None:
    """Read one shard's tensors into ``state`` (``where``: which shard each came from), checking each
    against the model's parameters."""
    with safe_open(str(f), framework="pt") as sf:
        for k in sf.keys():
            if k in state:
                raise CheckpointError(f"{f}: tensor '{k}' also in {where[k]}")
            if k not in want:
                raise CheckpointError(f"{f}: unexpected tensor '{k}' (not a parameter of LLaDA2MoeModelLM)")
            t = sf.get_tensor(k)
            if tuple(t.shape) != tuple(want[k].shape):
                raise CheckpointError(
                    f"{f}: tensor '{k}' has shape {tuple(t.shape)}, the config implies {tuple(want[k].shape)}"
                )
            state[k], where[k] = t, f.name
