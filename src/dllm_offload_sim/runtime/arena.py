"""The replay's slot arena: how many expert slots it takes and where each MoE layer's home lies, within a share of
the device's free memory."""

from __future__ import annotations

import os

import torch

from dllm_offload_sim.runtime.grouped import MAX_GROUPS
from dllm_offload_sim.runtime.slot_pool import block_layout
from dllm_offload_sim.traces.topology import ModelTopology

ARENA_MEMORY_SHARE = 0.85  # of the GPU's free memory the expert slots may take


def free_device_bytes(device) -> int:
    """Bytes the replay's arena may draw on ``device``: a GPU's free memory plus what torch's caching allocator holds
    but no tensor uses; on a CPU, the host's available memory (the arena lives there)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return (
            torch.cuda.mem_get_info(dev)[0]
            + torch.cuda.memory_reserved(dev)
            - torch.cuda.memory_allocated(dev)
        )
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def arena_layout(topo: ModelTopology, cache: int, total_slots: int, device) -> tuple[list, int]:
    """The replay's slot arena: (home range per MoE layer, slots). Homes of ``cache`` slots packed into
    blocks of ``MAX_GROUPS`` slots with a spill area of up to ``n_experts`` slots per block for the copies
    a layer makes beyond its home (so its grouped calls stay in one block: one captured graph), shrunk
    until the arena takes at most ``ARENA_MEMORY_SHARE`` of the device's free memory; at least
    ``total_slots + n_experts`` slots in all (every policy's residents plus one layer's copies)."""
    E, L = topo.n_experts, topo.n_moe_layers
    min_free = total_slots - L * cache + E
    dev = torch.device(device)
    free = free_device_bytes(dev)
    budget = ARENA_MEMORY_SHARE * free
    for spill in range(E, -1, -16):
        homes, n_slots = block_layout(L, cache, spill, MAX_GROUPS, min_free)
        if n_slots * topo.expert_bytes <= budget:
            return homes, n_slots
    need = (total_slots + E) * topo.expert_bytes / 2**30
    raise MemoryError(
        f"{topo.name} at Cache {cache}: {need:.1f} GiB of expert slots (every layer's cache plus "
        f"one layer's experts) exceed {ARENA_MEMORY_SHARE:.0%} of the {dev.type} device's free memory "
        f"({free / 2**30:.1f} GiB)"
    )
