"""Trace analytics: the paper's workload-characterisation numbers, computed from any trace.

* same-layer expert-set overlap vs iteration gap, within a block and across block boundaries (Fig. 7);
* distinct experts per MoE layer per forward for the block vs one token, and expert FLOPs (Fig. 4);
* per-layer activation ratio (Fig. 10c);
* token confidence vs routing stability (Fig. 10a/b).

Overlap of forward i with a later forward j at layer l is ``|A_i ∩ A_j| / |A_j|``: the share of the
later forward's activated experts that the earlier one already activated, i.e. the hit rate an
unbounded cache holding A_i would get. The Jaccard index is reported beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.schema import DENOISE, PREFILL, RequestArrays
from dllm_offload_sim.traces.topology import ModelTopology

CONF_BINS = np.linspace(0.0, 1.0, 11)


def activation_sets(req: RequestArrays, n_experts: int) -> np.ndarray:
    """Boolean ``[S, L, E]``: expert e of MoE layer l was activated by forward s."""
    S, L = req.n_steps, req.ids.shape[1]
    act = np.zeros((S, L, n_experts), bool)
    step_of_row = np.repeat(np.arange(S), req.n_tokens)
    act[step_of_row[:, None, None], np.arange(L)[None, :, None], req.ids.astype(np.int64)] = True
    return act


def _pair_overlap(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Overlap and Jaccard per layer of activation sets a (earlier) and b (later), each ``[L, E]``."""
    inter = (a & b).sum(-1)
    later = np.maximum(b.sum(-1), 1)
    union = np.maximum((a | b).sum(-1), 1)
    return inter / later, inter / union


def _route_kept(ids_a: np.ndarray, ids_b: np.ndarray) -> np.ndarray:
    """Share of a token's top-k experts kept from one forward to the next, per layer: [rows, L]."""
    return (ids_a[..., :, None] == ids_b[..., None, :]).any(-1).sum(-1) / ids_a.shape[-1]


# the groups of masked tokens whose route kept per layer `dllm-stats` reports (stability_layers.csv)
KEPT_GROUPS = {
    "decoded": "decoded at that forward (confidence >= the threshold)",
    "masked_conf_0.5_up": "still masked, confidence >= 0.5",
    "masked_conf_below_0.3": "still masked, confidence < 0.3",
}


@dataclass
class _Acc:
    """Running sums, so that analytics stream over requests."""

    gap_sum: dict = field(default_factory=dict)  # (kind, gap) -> [overlap_sum, jaccard_sum, count]
    distinct_sum: np.ndarray | None = None  # [L] sum over decode forwards of distinct experts
    distinct_n: int = 0
    rows_sum: float = 0.0  # routed token rows over decode forwards
    decoded_sum: int = 0
    decode_forwards: int = 0
    denoise_forwards: int = 0
    prefill_distinct: list = field(default_factory=list)
    conf: list = field(default_factory=list)  # masked tokens that stay masked: confidence, route kept
    stab: list = field(default_factory=list)
    conf_all: list = field(default_factory=list)  # every masked token, those decoded at that forward included
    stab_all: list = field(default_factory=list)
    decoded_stab: list = field(default_factory=list)
    layer_per_forward: list = field(default_factory=list)  # per request [F, L] distinct, for variance
    kept_sum: dict = field(
        default_factory=dict
    )  # KEPT_GROUPS name -> [L] sum of the route kept, and its count
    kept_n: dict = field(default_factory=dict)


def _add_request(acc: _Acc, req: RequestArrays, topo: ModelTopology, max_gap: int) -> None:
    act = activation_sets(req, topo.n_experts)
    distinct = act.sum(-1)  # [S, L]
    dec = req.phase != PREFILL
    if acc.distinct_sum is None:
        acc.distinct_sum = np.zeros(topo.n_moe_layers)
    acc.distinct_sum += distinct[dec].sum(0)
    acc.distinct_n += int(dec.sum())
    acc.rows_sum += float(req.n_tokens[dec].sum())
    acc.decoded_sum += int(req.n_decoded.sum())
    acc.decode_forwards += int(dec.sum())
    acc.denoise_forwards += int((req.phase == DENOISE).sum())
    acc.prefill_distinct.extend(distinct[req.phase == PREFILL].mean(-1).tolist())

    steps = np.flatnonzero(dec)
    blocks = req.block[steps]
    for gi, i in enumerate(steps):
        for gap in range(1, max_gap + 1):
            if gi + gap >= len(steps):
                break
            j = steps[gi + gap]
            kind = "within_block" if blocks[gi + gap] == blocks[gi] else "boundary"
            if kind == "boundary" and blocks[gi + gap] != blocks[gi] + 1:
                continue
            ov, jac = _pair_overlap(act[i], act[j])
            s = acc.gap_sum.setdefault((kind, gap), [0.0, 0.0, 0])
            s[0] += ov.sum()
            s[1] += jac.sum()
            s[2] += ov.shape[0]

    # confidence (output of forward i) vs the token's route kept at forward i+1, same block
    for a, b in zip(steps[:-1], steps[1:]):
        if req.block[a] != req.block[b] or req.n_tokens[a] != req.n_tokens[b]:
            continue
        ra, rb = req.rows(a), req.rows(b)
        kept = _route_kept(req.ids[ra], req.ids[rb])
        stab = kept.mean(-1)
        masked = req.was_masked[ra] & ~np.isnan(req.confidence[ra])
        still = masked & ~req.decoded[ra]
        c = req.confidence[ra]
        for name, rows in (
            ("decoded", masked & req.decoded[ra]),
            ("masked_conf_0.5_up", still & (c >= 0.5)),
            ("masked_conf_below_0.3", still & (c < 0.3)),
        ):
            acc.kept_sum[name] = acc.kept_sum.get(name, 0.0) + kept[rows].sum(0)
            acc.kept_n[name] = acc.kept_n.get(name, 0) + int(rows.sum())
        acc.conf.extend(req.confidence[ra][still].tolist())
        acc.stab.extend(stab[still].tolist())
        acc.conf_all.extend(req.confidence[ra][masked].tolist())
        acc.stab_all.extend(stab[masked].tolist())
        acc.decoded_stab.extend(stab[~req.was_masked[ra]].tolist())


@dataclass
class TraceStats:
    """The analytics of a trace: a one-row summary and the tables behind each figure."""

    summary: dict
    overlap: pd.DataFrame  # kind, gap, overlap, jaccard, n
    layers: pd.DataFrame  # layer, distinct_block, distinct_token, activation_ratio
    confidence: pd.DataFrame  # bin_lo, bin_hi, mean_stability, n
    conf_samples: np.ndarray  # [n, 2] (confidence, stability) for the 2-D histogram
    # layer, then the route kept of each KEPT_GROUPS group (and its rows, n_*)
    stability_layers: pd.DataFrame = None


def compute_stats(trace, requests=None, max_gap: int = 8, progress: bool = False) -> TraceStats:
    """Stream over the trace's requests and compute every analytic."""
    topo = trace.topology
    acc = _Acc()
    ids = trace.request_ids if requests is None else list(requests)
    if not ids:
        raise TraceError(f"{trace.path}: holds no requests; nothing to analyse")
    it = ids
    if progress:
        from tqdm import tqdm

        it = tqdm(ids, desc="analysing requests", unit="req")
    for rid in it:
        _add_request(acc, trace.request(rid), topo, max_gap)

    rows = []
    for (kind, gap), (ov, jac, n) in sorted(acc.gap_sum.items()):
        rows.append({"kind": kind, "gap": gap, "overlap": ov / n, "jaccard": jac / n, "n": n})
    overlap = pd.DataFrame(rows, columns=["kind", "gap", "overlap", "jaccard", "n"])

    distinct = acc.distinct_sum / max(acc.distinct_n, 1) if acc.distinct_sum is not None else np.zeros(0)
    layers = pd.DataFrame(
        {
            "layer": list(topo.moe_layers),
            "distinct_block": distinct,
            "distinct_token": float(topo.top_k),
            "activation_ratio": distinct / topo.n_experts,
        }
    )

    conf, stab = np.asarray(acc.conf, float), np.asarray(acc.stab, float)
    conf_all, stab_all = np.asarray(acc.conf_all, float), np.asarray(acc.stab_all, float)

    def in_bin(c, lo, hi):
        return (c >= lo) & ((c < hi) | (hi == 1.0) & (c <= hi))

    crow = []
    for lo, hi in zip(CONF_BINS[:-1], CONF_BINS[1:]):
        m, ma = in_bin(conf, lo, hi), in_bin(conf_all, lo, hi)
        crow.append(
            {
                "bin_lo": lo,
                "bin_hi": hi,
                "mean_stability": stab[m].mean() if m.any() else np.nan,
                "n": int(m.sum()),
                "mean_stability_with_decoded": stab_all[ma].mean() if ma.any() else np.nan,
                "n_with_decoded": int(ma.sum()),
            }
        )
    confidence = pd.DataFrame(crow)

    def pick(kind, gap):
        r = overlap[(overlap.kind == kind) & (overlap.gap == gap)]
        return float(r.overlap.iloc[0]) if len(r) else float("nan")

    mean_rows = acc.rows_sum / max(acc.decode_forwards, 1)
    block_distinct = float(distinct.mean()) if distinct.size else float("nan")

    def kept(st, m):  # mean route-kept rate of the rows that ``m`` selects (NaN if none)
        return float(st[m].mean()) if m.any() else float("nan")

    high, low = kept(stab, conf >= 0.7), kept(stab, conf < 0.3)
    summary = {
        "trace_source": trace.source,
        "model": topo.name,
        "block_length": trace.block_length,
        "requests": len(ids),
        "decode_forwards": acc.decode_forwards,
        "tokens_per_forward": acc.decoded_sum / max(acc.decode_forwards, 1),
        "adjacent_overlap": pick("within_block", 1),
        "boundary_overlap": pick("boundary", 1),
        "distinct_experts_per_layer": block_distinct,
        "distinct_experts_single_token": float(topo.top_k),
        "footprint_ratio_vs_token": block_distinct / topo.top_k,
        "expert_gflops_per_layer_block": mean_rows * topo.top_k * topo.expert_flops_per_token / 1e9,
        "expert_gflops_per_layer_token": topo.top_k * topo.expert_flops_per_token / 1e9,
        "flops_ratio_vs_token": mean_rows,
        "activation_ratio_min": float(layers.activation_ratio.min()) if len(layers) else float("nan"),
        "activation_ratio_max": float(layers.activation_ratio.max()) if len(layers) else float("nan"),
        "stability_high_conf": float(high),
        "stability_low_conf": float(low),
        # every masked token, those decoded at that forward included (a token above the decoding threshold of 0.9
        # is decoded at once, so among the tokens that stay masked none is that confident)
        "stability_conf_0.9_up": kept(stab_all, conf_all >= 0.9),
        "stability_conf_below_0.5": kept(stab_all, conf_all < 0.5),
        "stability_decoded": float(np.mean(acc.decoded_stab)) if acc.decoded_stab else float("nan"),
        "conf_stability_corr": float(np.corrcoef(conf, stab)[0, 1]) if conf.size > 2 else float("nan"),
    }
    kept_cols = {"layer": list(topo.moe_layers)}
    for name in KEPT_GROUPS:
        n = acc.kept_n.get(name, 0)
        kept_cols[name] = acc.kept_sum[name] / n if n else np.full(topo.n_moe_layers, np.nan)
        kept_cols[f"n_{name}"] = n
    return TraceStats(
        summary,
        overlap,
        layers,
        confidence,
        np.stack([conf, stab], 1) if conf.size else np.zeros((0, 2)),
        pd.DataFrame(kept_cols),
    )
