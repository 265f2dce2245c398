"""LLaDA2 routing math in numpy: group-limited top-k selection and combine weights.

Used by the synthetic generator; the PyTorch model implements the same math on tensors.
"""

from __future__ import annotations

import numpy as np


def group_limited_topk(scores: np.ndarray, n_group: int, topk_group: int, k: int) -> np.ndarray:
    """Top-``k`` expert ids per row, restricted to the ``topk_group`` best groups.

    ``scores`` is ``[..., E]`` (selection scores: sigmoid + expert bias in LLaDA2). A group's score is
    the sum of its two best experts; experts outside the kept groups cannot be chosen. Ids come out
    ordered by descending score.
    """
    *lead, E = scores.shape
    g = scores.reshape(*lead, n_group, E // n_group)
    top2 = np.partition(g, -2, axis=-1)[..., -2:].sum(-1) if g.shape[-1] >= 2 else g[..., 0]
    keep = np.argpartition(-top2, topk_group - 1, axis=-1)[..., :topk_group]
    gmask = np.zeros(top2.shape, bool)
    np.put_along_axis(gmask, keep, True, axis=-1)
    masked = np.where(np.repeat(gmask, E // n_group, axis=-1), scores, -np.inf)
    idx = np.argpartition(-masked, k - 1, axis=-1)[..., :k]
    vals = np.take_along_axis(masked, idx, axis=-1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(idx, order, axis=-1)


def combine_weights(sigmoid_scores: np.ndarray, ids: np.ndarray, scaling: float = 2.5) -> np.ndarray:
    """Normalised, scaled combine weights of the chosen experts (from the unbiased sigmoid scores)."""
    s = np.take_along_axis(sigmoid_scores, ids, axis=-1)
    return (s / (s.sum(-1, keepdims=True) + 1e-20) * scaling).astype(np.float32)
