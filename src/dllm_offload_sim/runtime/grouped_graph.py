"""A layer's grouped expert call as one replayable CUDA graph: routing plan built on the GPU, then the FFN.

The eager call (:func:`runtime.grouped.grouped_ffn` over :func:`~runtime.grouped.plan_from_numpy`)
builds its plan on the host and issues about a dozen operators: ~0.35 ms of host time per call on the
H200 host, more than a decode layer's kernels, so the replay was host-bound and followed the shared
host's drifting speed. Here the host only packs the layer's routing (expert ids,
gate weights) and slot table into one pinned buffer, copies it to a fixed device buffer and replays a
graph that does the rest on the GPU: slot of each (token, expert) pair, a sort by slot, each slot's
group end (``searchsorted``), the gather, two grouped GEMMs, SwiGLU and the weighted scatter-add.

A graph has fixed shapes: ``T`` tokens x ``k`` routed experts, and one *window* of at most
``MAX_GROUPS`` consecutive slots (``torch._grouped_mm`` takes at most that many groups). Pairs whose
expert has no slot in the window sort behind the window's groups; the grouped GEMM leaves their rows
unwritten and they are added into a scratch row ``T`` of the output, which callers never read. The
slot pool lays layers out so that a layer's experts share one window (``runtime.slot_pool.block_layout``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dllm_offload_sim.runtime.cuda_copies import batch_copier
from dllm_offload_sim.runtime.timing import graphed
from dllm_offload_sim.runtime.grouped import MAX_GROUPS, _ffn, pack_into, packed_offsets

# pinned staging buffers a graph fills in turn (a layer's hits' and copies' calls may share one)
UPLOAD_BUFFERS = 2


def capturable(x: torch.Tensor) -> bool:
    """Whether the grouped call on ``x``'s device and dtype runs without host synchronisation (so it can
    be captured): ``torch._grouped_mm`` on CUDA in bf16. Elsewhere the call runs eagerly."""
    return x.is_cuda and x.dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")


def _window_outputs(
    xs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, offs: torch.Tensor
) -> torch.Tensor:
    """``FFN_g(xs[rows of group g])`` for the groups ending at ``offs`` (rows past the last end: any value)."""
    if capturable(xs):
        i = w2.shape[2]
        h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offs)
        return torch._grouped_mm(F.silu(h[:, :i]) * h[:, i:], w2.transpose(1, 2), offs=offs)
    y = torch.zeros_like(xs)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            y[start:end] = _ffn(xs[start:end], w13[g], w2[g])
        start = end
    return y


def window_grouped_ffn(
    x: torch.Tensor,
    out_ext: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    lut: torch.Tensor,
    window: tuple[int, int],
    w13: torch.Tensor,
    w2: torch.Tensor,
    arange: torch.Tensor,
) -> None:
    """Add ``sum weight * FFN_slot(x[token])`` over the pairs of ``ids [T, k]`` whose slot ``lut[id]`` lies
    in ``window = (first slot, n slots)`` into ``out_ext[:T]`` (row ``T`` takes the other pairs' garbage).
    Fixed shapes throughout and no host synchronisation on CUDA: capturable. ``arange``: ``[>= n]`` int64."""
    T, k = ids.shape
    lo, n = window
    rel = lut[ids.reshape(-1)] - lo
    key = torch.where((rel >= 0) & (rel < n), rel, n)  # pairs outside the window sort last
    skey, order = torch.sort(key, stable=True)
    offs = torch.searchsorted(skey, arange[:n], right=True).to(torch.int32)  # group g ends after keys <= g
    tok = torch.div(order, k, rounding_mode="floor")
    dest = torch.where(skey < n, tok, T)
    y = _window_outputs(x.index_select(0, tok), w13[lo : lo + n], w2[lo : lo + n], offs)
    w = weights.reshape(-1).index_select(0, order).to(y.dtype)
    out_ext.index_add_(0, dest, (y * w[:, None]).to(out_ext.dtype))


class GroupedGraph:
    """One grouped expert call at fixed shapes (``x [T, H]``, ``k`` experts per token, one slot window):
    :meth:`run` uploads a layer's routing and slot table in one copy and replays the call (captured as a
    CUDA graph where :func:`capturable`, else run eagerly with the same code). Decides nothing."""

    def __init__(
        self,
        x: torch.Tensor,
        out_ext: torch.Tensor,
        k: int,
        n_experts: int,
        window: tuple[int, int],
        w13: torch.Tensor,
        w2: torch.Tensor,
    ):
        T = x.shape[0]
        lo, n = window
        if not 0 < n <= MAX_GROUPS or lo < 0 or lo + n > w13.shape[0]:
            raise ValueError(
                f"window {window} must be 1..{MAX_GROUPS} slots inside the {w13.shape[0]}-slot arena"
            )
        if tuple(out_ext.shape) != (T + 1, x.shape[1]):
            raise ValueError(
                f"out_ext must be [{T + 1}, {x.shape[1]}] (a scratch row after x's rows), "
                f"got {list(out_ext.shape)}"
            )
        self.T, self.k, self.E, self.window = T, k, n_experts, window
        P, dev = T * k, x.device
        self.cuda = dev.type == "cuda"
        # the fixed device inputs, laid out as _packed_host packs them: ids (int64), slot table (int64), weights (fp32)
        (o_ids, o_lut, o_w), n_bytes = packed_offsets([8 * P, 8 * n_experts, 4 * P])
        self._offs, self._nbytes = (o_ids, o_lut, o_w), n_bytes
        self.stage = torch.zeros(n_bytes, dtype=torch.uint8, device=dev)
        # on a GPU the inputs go up from pinned buffers of the graph's own, filled in turn: a fresh pinned buffer per
        # call would go through torch's pinned allocator, whose event bookkeeping costs more host time than the call
        self._host = (
            [torch.zeros(n_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(UPLOAD_BUFFERS)]
            if self.cuda
            else []
        )
        self._host_np = [b.numpy() for b in self._host] or [self.stage.numpy()]  # on the CPU: packed in place
        self._copied: list = [None] * UPLOAD_BUFFERS  # per buffer: the event after its last copy
        self._turn = 0
        self._copier = batch_copier(dev) if self.cuda else None
        ids = self.stage[o_ids : o_ids + 8 * P].view(torch.int64).view(T, k)
        lut = self.stage[o_lut : o_lut + 8 * n_experts].view(torch.int64)
        w = self.stage[o_w : o_w + 4 * P].view(torch.float32).view(T, k)
        lut.fill_(-1)  # warm-up and capture see no pair in the window: they write only the scratch row
        ar = torch.arange(n, device=dev)
        # the closure holds every tensor the graph reads (x, out_ext, the staged inputs, arange, the slot
        # arena): kept alive with the graph, or their memory would be reused under it
        self._fn = lambda: window_grouped_ffn(x, out_ext, ids, w, lut, window, w13, w2, ar)  # noqa: E731
        self.graphed = capturable(x)
        self._replay = graphed(self._fn, dev) if self.graphed else self._fn

    def upload(self, ids: np.ndarray, weights: np.ndarray, lut: np.ndarray, current=None) -> None:
        """Copy the call's inputs into the graph's fixed buffer (asynchronously, from pinned memory) on the current
        stream, where the graph replays; ``current``: that stream where the caller knows it (saves looking it up)."""
        if ids.shape != (self.T, self.k) or lut.shape != (self.E,):
            raise ValueError(
                f"routing {ids.shape} / slot table {lut.shape} do not match the graph's "
                f"({self.T}, {self.k}) / ({self.E},)"
            )
        arrays = [np.asarray(ids, np.int64), np.asarray(lut, np.int64), np.asarray(weights, np.float32)]
        if not self.cuda:
            pack_into(self._host_np[0], arrays, self._offs)
            return
        i = self._turn
        self._turn = (i + 1) % UPLOAD_BUFFERS
        done = self._copied[i]
        if done is None:
            done = self._copied[i] = torch.cuda.Event()
        else:
            done.synchronize()  # its last copy has run (long since: the runtime waits for each layer's routing)
        pack_into(self._host_np[i], arrays, self._offs)
        stream = current if current is not None else torch.cuda.current_stream(self.stage.device)
        if self._copier is not None:
            self._copier.copy_one(
                self.stage.data_ptr(), self._host[i].data_ptr(), self._nbytes, stream.cuda_stream
            )
        else:
            self.stage.copy_(self._host[i], non_blocking=True)
        done.record(stream)

    def replay(self) -> None:
        """Run the call on the inputs last uploaded."""
        self._replay()

    def run(self, ids: np.ndarray, weights: np.ndarray, lut: np.ndarray) -> None:
        """Add the layer's grouped expert output for ``ids [T, k]`` with ``weights``, over the experts whose
        slot ``lut[expert]`` lies in the window, into the output buffer."""
        self.upload(ids, weights, lut)
        self._replay()


def window_of(slots: np.ndarray, window: int = MAX_GROUPS) -> int | None:
    """The index of the aligned ``window``-slot block holding all of ``slots`` (None: they span several)."""
    if len(slots) == 0:
        return None
    a, b = int(slots.min()) // window, int(slots.max()) // window
    return a if a == b else None
