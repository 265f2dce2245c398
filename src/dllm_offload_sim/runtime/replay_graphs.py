"""The replay's non-expert work, captured once and lent to every replay of a validation run and its repeats (or a
whole sweep).

Each forward's non-expert part (a MoE layer's attention and gate, a dense layer, the lm-head) replays as one CUDA
graph per (tokens, KV length). Decoding gives every forward a new KV length, so a replay of one request captures
hundreds of graphs (part of the ~10 s set-up of each validation run on the H200 host, repeats included). The weights
are random and the replay never reads what the graphs compute, so one set serves any number of replays in turn,
whatever their policy and cache.
"""

from __future__ import annotations

import torch

from dllm_offload_sim.runtime.layer import LmHead, NonExpertLayer
from dllm_offload_sim.runtime.timing import graphed
from dllm_offload_sim.traces.topology import ModelTopology


class ReplayGraphs:
    """Decides nothing: holds the non-expert layers and lm-head of ``topo`` on ``device``, the KV cache, the
    activation and expert-output buffers per token count, and the captured graphs per (tokens, KV length)."""

    def __init__(self, topo: ModelTopology, device, dtype=torch.bfloat16):
        self.topo, self.device, self.dtype = topo, torch.device(device), dtype
        self.moe_layer = NonExpertLayer(topo, device=self.device, dtype=dtype)
        self.dense_layer = NonExpertLayer(topo, device=self.device, dtype=dtype, dense=True)
        self.head = LmHead(topo, device=self.device, dtype=dtype)
        self.kv = None
        self.x: dict = {}  # tokens -> (activations [T, H], expert output [T + 1, H] with a scratch row)
        self.rows: dict = {}  # tokens -> the expert output's first T rows (a view kept, for the CPU result's add)
        self.graphs: dict = {}  # (tokens, kv length) -> (MoE layer's non-expert part, dense layer, lm-head)

    def prepare(self, forwards) -> None:
        """Capture what ``forwards`` need and is not held yet. A longer KV cache than the one held replaces it and
        every graph (a graph keeps the cache it was captured with); the buffers stay."""
        kv_max = max(f.kv_len + f.n_tokens for f in forwards)
        if self.kv is None or self.kv[0].shape[1] < kv_max:
            self.kv = self.moe_layer.new_cache(kv_max)
            self.graphs.clear()
        H = self.topo.hidden
        for f in forwards:
            T = f.n_tokens
            if T not in self.x:
                self.x[T] = (
                    torch.randn((T, H), device=self.device, dtype=self.dtype),
                    torch.zeros((T + 1, H), device=self.device, dtype=self.dtype),
                )
                self.rows[T] = self.x[T][1][:T]
            key = (T, f.kv_len)
            if key in self.graphs:
                continue
            x = self.x[T][0]
            self.graphs[key] = (
                graphed(lambda x=x, kv=f.kv_len: self.moe_layer(x, self.kv, kv), self.device),
                graphed(lambda x=x, kv=f.kv_len: self.dense_layer(x, self.kv, kv), self.device),
                graphed(lambda x=x: self.head(x), self.device),
            )

    def close(self) -> None:
        """Give the graphs, buffers and KV cache back; :meth:`prepare` builds them again if called after."""
        self.graphs.clear()
        self.x.clear()
        self.rows.clear()
        self.kv = None
