"""CpuExperts: runs missed experts on the CPU from host weights (activations in, results out)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F


def cpu_expert_ffn(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, compute_dtype=None) -> torch.Tensor:
    """One expert's SwiGLU FFN on the CPU, in the weights' dtype unless ``compute_dtype`` says otherwise
    (a different dtype converts the weights on every call)."""
    dt = compute_dtype or w13.dtype
    xc = x.to(dt)
    h = xc @ w13.to(dt).t()
    i = w2.shape[1]
    return (F.silu(h[:, :i]) * h[:, i:]) @ w2.to(dt).t()


def layer_jobs(host, layer: int, experts, ids: np.ndarray, weights: np.ndarray) -> list:
    """The CPU jobs of one MoE layer: for each of ``experts`` its host weights, the rows routed to it
    (one sort of the routing ``ids [T, k]``) and their gate weights, as :meth:`CpuExperts.run` takes them."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    wflat = weights.reshape(-1)
    jobs = []
    for e in experts:
        lo, hi = np.searchsorted(sorted_ids, e), np.searchsorted(sorted_ids, e, side="right")
        pos = order[lo:hi]  # flat (row, slot) positions routed to e, in row order
        w13, w2 = host.expert(layer, e)
        jobs.append((w13, w2, torch.from_numpy(pos // k), torch.from_numpy(np.ascontiguousarray(wflat[pos]))))
    return jobs


class CpuExperts:
    """Decides nothing: computes the experts it is given, ``workers`` at a time.

    ``run(x_cpu, jobs)`` takes the layer's activations on the host and ``jobs`` = list of
    (w13, w2, token_rows, gate_weights); it returns ``[T, H]`` of the weighted sum of their outputs.
    With one worker (the default) each expert uses torch's intra-op threads: ``threads`` of them
    (set in the thread that runs the experts; torch's setting is per thread), or torch's default.
    The profiler records the count it measured with and the replay runs with the profile's.
    """

    def __init__(self, workers: int = 1, compute_dtype=None, threads: int | None = None):
        self.workers = max(1, int(workers))
        self.compute_dtype = compute_dtype
        if threads is not None and int(threads) < 1:
            raise ValueError(f"CpuExperts: threads must be >= 1, got {threads!r}")
        self.threads = None if threads is None else int(threads)
        self._pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None

    def _set_threads(self):
        if self.threads is not None and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)

    def _one(self, x, job):
        self._set_threads()
        w13, w2, rows, w = job
        y = cpu_expert_ffn(x[rows], w13, w2, self.compute_dtype)
        return rows, y * w.to(y.dtype)[:, None]

    def run(self, x: torch.Tensor, jobs, out: torch.Tensor | None = None) -> torch.Tensor:
        """The weighted sum of ``jobs``' outputs, added into ``out`` (fp32 ``[T, H]``, zeros if None;
        the replay passes pinned memory so that the result goes back to the GPU asynchronously)."""
        if out is None:
            out = torch.zeros((x.shape[0], x.shape[1]), dtype=torch.float32)
        results = (
            self._pool.map(lambda j: self._one(x, j), jobs) if self._pool else (self._one(x, j) for j in jobs)
        )
        for rows, y in results:
            out.index_add_(0, rows, y.float())
        return out

    def close(self):
        if self._pool:
            self._pool.shutdown()
