"""A converter from an engine's routing dump to the interchange format: SGLang-style routed experts.

An autoregressive engine that returns the routed experts of each request (SGLang's ``return_routed_experts``; vLLM's
and others' expert-recording hooks give the same array) hands back, per request, the top-k expert ids of every token
it ran through the model at every MoE layer: an array ``[tokens, layers, top_k]`` whose first ``prompt_tokens`` rows
are the prompt's prefill and whose later rows are one decode step each. This script reads such a dump (JSON Lines,
one request per line: ``{"rid": ..., "prompt_tokens": P, "routed_experts": [[[ids] per layer] per token]}``) and
writes the interchange file ``dllm-trace-import`` reads. The dump has no gate weights, so the trace records uniform
ones (``1 / top_k``), which only the policies that read weights (OLED's gate mass) feel.

    python examples/sglang_routed_experts.py --demo dump.jsonl        # a made-up dump of Qwen3-30B-A3B's shape
    python examples/sglang_routed_experts.py dump.jsonl --model qwen3-30b-a3b --out routing.jsonl
    dllm-trace-import routing.jsonl --out traces_out/qwen3 && dllm-trace-check traces_out/qwen3
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from dllm_offload_sim.traces.catalogue import find_model
from dllm_offload_sim.traces.interchange import InterchangeHeader, InterchangeWriter


def convert(dump: str, model: str, out: str) -> int:
    """Write ``dump`` (SGLang-style routed experts) as an interchange file; returns the rows written."""
    topo = find_model(model).topology
    rows = 0
    with InterchangeWriter(out, InterchangeHeader(model, "autoregressive", 1, engine="sglang")) as w:
        with open(dump) as fh:
            for line in fh:
                req = json.loads(line)
                experts = np.asarray(req["routed_experts"])  # [tokens, layers, top_k]
                p = int(req["prompt_tokens"])
                for t in range(experts.shape[0]):
                    forward, token = (
                        (0, t) if t < p else (t - p + 1, 0)
                    )  # the prefill, then one token per step
                    for j, layer in enumerate(topo.moe_layers):
                        w.row(req["rid"], forward, layer, token, experts[t, j])
                        rows += 1
    return rows


def demo_dump(path: str, model: str = "qwen3-30b-a3b", requests: int = 2, seed: int = 0) -> None:
    """A made-up dump in that layout (random routing with some reuse between steps), to try the converter on."""
    topo = find_model(model).topology
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for rid in range(requests):
            p, c = 12, 24
            prev = rng.permuted(np.tile(np.arange(topo.n_experts), (topo.n_moe_layers, 1)), axis=1)
            rows = []
            for _ in range(p + c - 1):
                keep = (
                    rng.random(topo.n_moe_layers) < 0.6
                )  # a layer keeps its previous routing 60% of the time
                fresh = rng.permuted(np.tile(np.arange(topo.n_experts), (topo.n_moe_layers, 1)), axis=1)
                prev = np.where(keep[:, None], prev, fresh)
                rows.append(prev[:, : topo.top_k].tolist())
            fh.write(json.dumps({"rid": rid, "prompt_tokens": p, "routed_experts": rows}) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump", help="the dump to read (or, with --demo, to write)")
    ap.add_argument("--model", default="qwen3-30b-a3b", help="the catalogue model that produced it")
    ap.add_argument("--out", default="routing.jsonl", help="the interchange file to write")
    ap.add_argument("--demo", action="store_true", help="write a made-up dump at DUMP instead")
    a = ap.parse_args(argv)
    if a.demo:
        demo_dump(a.dump, a.model)
        print(f"wrote {a.dump} (made up)")
    else:
        print(f"wrote {a.out}: {convert(a.dump, a.model, a.out)} routed rows")


if __name__ == "__main__":
    main()
