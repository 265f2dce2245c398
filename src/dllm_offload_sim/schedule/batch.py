"""Batched forwards: the k-th forwards of B requests decoded in lockstep, as one forward.

Synchronous batched decoding: forward k of a batch routes the rows of forward k of every request
in the batch that is still decoding (a finished request drops out). Everything the simulator and
the policies need per forward is precomputed here once, so the event loop never touches pandas.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from dllm_offload_sim.policies.base import ForwardInfo
from dllm_offload_sim.policies.jit import kernel
from dllm_offload_sim.traces.schema import COMMIT, DENOISE, PREFILL, RequestArrays


@dataclass
class BatchedForward:
    """One forward pass of a batch (rows of all its requests concatenated)."""

    index: int  # forward number in the run
    batch: int  # batch number in the run
    phase: int  # PREFILL if any request prefills, else DENOISE if any denoises, else COMMIT
    n_tokens: int
    kv_len: int  # mean cached length over the batch's requests
    ids: np.ndarray  # [T, L, k]
    weights: np.ndarray  # [T, L, k]
    counts: np.ndarray  # [L, E] tokens routed to each expert
    prev_confidence: np.ndarray  # [T] confidence of the previous forward's output (NaN if none)
    own_confidence: np.ndarray  # [T] confidence of this forward's output (NaN where undefined)
    masked: np.ndarray  # [T]
    block_start: bool
    decoded: dict  # request_id -> tokens unmasked by this forward
    measured: bool = True  # False for warm-up batches
    per_layer: tuple | None = field(
        default=None, repr=False, compare=False
    )  # precomputed (see __post_init__)

    def __post_init__(self):
        # per-layer data made once per forward (the engine and policies read one layer at a time):
        # ids / weights [L, T, k], and the activated experts with their token counts, cut per layer
        if self.per_layer is not None:  # made for a whole request at once (_single_request_forwards)
            self.ids_by_layer, self.weights_by_layer, self._es, self._tok, self._cut = self.per_layer
            self.per_layer = None
            return
        self.ids_by_layer = np.ascontiguousarray(self.ids.transpose(1, 0, 2).astype(np.int64))
        self.weights_by_layer = np.ascontiguousarray(self.weights.transpose(1, 0, 2))
        js, es = np.nonzero(self.counts)
        self._es, self._tok = es, self.counts[js, es]
        self._cut = np.searchsorted(js, np.arange(self.counts.shape[0] + 1)).tolist()

    def info(self) -> ForwardInfo:
        """What a policy is told of this forward as it begins."""
        return ForwardInfo(
            index=self.index,
            phase=self.phase,
            n_tokens=self.n_tokens,
            prev_confidence=self.prev_confidence,
            own_confidence=self.own_confidence,
            masked=self.masked,
            block_start=self.block_start,
            request_ids=tuple(self.decoded),
        )

    def routing_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every MoE layer's routing at once: the activated experts of all layers, layer by layer (each layer's
        sorted), the tokens routed to each, and where each layer's run starts (layer ``j``: ``[cut[j], cut[j + 1])``,
        as an int64 array)."""
        return self._es, self._tok, np.asarray(self._cut, np.int64)

    def routing(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`active`, :meth:`tokens`) of MoE layer ``j`` in one call (the engine's hot loop)."""
        c0, c1 = self._cut[j], self._cut[j + 1]
        return self._es[c0:c1], self._tok[c0:c1]

    def active(self, j: int) -> np.ndarray:
        """Sorted experts activated at MoE layer ``j``."""
        return self._es[self._cut[j] : self._cut[j + 1]]

    def tokens(self, j: int) -> np.ndarray:
        """Tokens routed to each of :meth:`active`'s experts."""
        return self._tok[self._cut[j] : self._cut[j + 1]]


def _prev_conf(req: RequestArrays, s: int, n_tokens: np.ndarray | None = None) -> np.ndarray:
    """Confidence rows of forward s-1 aligned to forward s's rows (same block), else NaN.
    ``n_tokens``: ``req.n_tokens`` when the caller has it already (it is recomputed on each access)."""
    nt = req.n_tokens if n_tokens is None else n_tokens
    n = int(nt[s])
    if s == 0 or req.phase[s - 1] == PREFILL or req.block[s - 1] != req.block[s] or nt[s - 1] != n:
        return np.full(n, np.nan, np.float32)
    return req.confidence[req.rows(s - 1)]


@kernel
def request_routing(ids, weights, row_offset, n_experts):
    """One request's routing ([N, L, k] ids and gate weights, forward s owning rows row_offset[s]:row_offset[s+1])
    regrouped for the engine in one pass: the token count of every (forward, layer, expert) [S, L, E]; its
    nonzero entries in (forward, layer, expert) order as experts and counts, with ``cut[s * L + j]`` the first
    entry of (s, j); and ids (as int64) and weights transposed to [L, N, k], so a layer's rows are contiguous."""
    N, L, k = ids.shape
    S = row_offset.shape[0] - 1
    counts = np.zeros((S, L, n_experts), np.int64)
    ids_l = np.empty((L, N, k), np.int64)
    w_l = np.empty((L, N, k), weights.dtype)
    for s in range(S):
        for r in range(row_offset[s], row_offset[s + 1]):
            for j in range(L):
                for i in range(k):
                    e = ids[r, j, i]
                    counts[s, j, e] += 1
                    ids_l[j, r, i] = e
                    w_l[j, r, i] = weights[r, j, i]
    nnz = 0
    for c in counts.ravel():
        nnz += c != 0
    experts, tokens = np.empty(nnz, np.int64), np.empty(nnz, np.int64)
    cut = np.empty(S * L + 1, np.int64)
    n = 0
    for s in range(S):
        for j in range(L):
            cut[s * L + j] = n
            for e in range(n_experts):
                if counts[s, j, e]:
                    experts[n], tokens[n] = e, counts[s, j, e]
                    n += 1
    cut[S * L] = n
    return counts, experts, tokens, cut, ids_l, w_l


# forwards whose routing one call of request_routing regroups: bounds the [S, L, E] counts it makes at once
CHUNK_BYTES = 8 << 20


def _single_request_forwards(
    r: RequestArrays, n_experts: int, first_index: int, batch: int, measured: bool
) -> Iterator[BatchedForward]:
    """The forwards of one request decoded alone (batch size 1), in order, with every per-forward array cut from
    arrays :func:`request_routing` makes for a run of consecutive forwards at once (instead of per forward), runs
    of at most :data:`CHUNK_BYTES` of counts, so memory does not grow with the request's length."""
    S, L = r.n_steps, r.ids.shape[1]
    off = r.row_offset
    ntok = np.diff(off)
    per_chunk = max(1, CHUNK_BYTES // (8 * L * n_experts))
    for s0 in range(0, S, per_chunk):
        s1 = min(S, s0 + per_chunk)
        base = int(off[s0])
        counts, es, tok, cut, ids_l, w_l = request_routing(
            r.ids[base : off[s1]], r.weights[base : off[s1]], off[s0 : s1 + 1] - base, n_experts
        )
        for k in range(s0, s1):
            c = k - s0
            r0, r1 = int(off[k]), int(off[k + 1])
            a, b = int(cut[c * L]), int(cut[(c + 1) * L])
            yield BatchedForward(
                index=first_index + k,
                batch=batch,
                phase=int(r.phase[k]),
                n_tokens=r1 - r0,
                kv_len=int(r.kv_len[k]),
                ids=r.ids[r0:r1],
                weights=r.weights[r0:r1],
                counts=counts[c],
                prev_confidence=_prev_conf(r, k, ntok),
                own_confidence=r.confidence[r0:r1],
                masked=r.was_masked[r0:r1],
                block_start=k == 0 or r.block[k] != r.block[k - 1],
                decoded={r.request_id: int(r.n_decoded[k])},
                measured=measured,
                per_layer=(
                    ids_l[:, r0 - base : r1 - base],
                    w_l[:, r0 - base : r1 - base],
                    es[a:b],
                    tok[a:b],
                    (cut[c * L : (c + 1) * L + 1] - a).tolist(),
                ),
            )


def batched_forwards(
    requests: Sequence[RequestArrays], batch_size: int, n_experts: int, warmup_requests: int = 0
) -> Iterator[BatchedForward]:
    """Group ``requests`` into batches of ``batch_size`` and yield every batched forward in order.

    Streamed: a forward is made when it is asked for, and a batch's requests are read from ``requests`` (a list, or
    a :class:`RequestSource` that reads them from the trace) only when the batch begins, so a consumer that keeps
    no forward holds one batch in memory."""
    n = 0
    for b0 in range(0, len(requests), batch_size):
        measured = b0 >= warmup_requests
        if batch_size == 1:
            r = requests[b0]
            yield from _single_request_forwards(r, n_experts, n, b0, measured)
            n += r.n_steps
            del r  # before the next request is read
            continue
        batch = [requests[i] for i in range(b0, min(b0 + batch_size, len(requests)))]
        n_steps = max(r.n_steps for r in batch)
        for k in range(n_steps):
            live = [r for r in batch if k < r.n_steps]
            phases = {int(r.phase[k]) for r in live}
            phase = PREFILL if PREFILL in phases else (DENOISE if DENOISE in phases else COMMIT)
            ids = np.concatenate([r.ids[r.rows(k)] for r in live])
            L = ids.shape[1]
            counts = np.bincount(
                (ids.astype(np.int64) + (np.arange(L) * n_experts)[None, :, None]).ravel(),
                minlength=L * n_experts,
            ).reshape(L, n_experts)
            yield BatchedForward(
                index=n,
                batch=b0 // batch_size,
                phase=phase,
                n_tokens=int(ids.shape[0]),
                kv_len=int(round(np.mean([r.kv_len[k] for r in live]))),
                ids=ids,
                weights=np.concatenate([r.weights[r.rows(k)] for r in live]),
                counts=counts,
                prev_confidence=np.concatenate([_prev_conf(r, k) for r in live]),
                own_confidence=np.concatenate([r.confidence[r.rows(k)] for r in live]),
                masked=np.concatenate([r.was_masked[r.rows(k)] for r in live]),
                block_start=any(k == 0 or r.block[k] != r.block[k - 1] for r in live),
                decoded={r.request_id: int(r.n_decoded[k]) for r in live},
                measured=measured,
            )
            n += 1


class RequestSource(Sequence):
    """The requests a run replays, in order, read from their trace when asked for: ``source[i]`` is request
    ``ids[i]``, from ``loaded`` (request id -> :class:`RequestArrays`) where it is there, else read by ``read``
    (``Trace.request``) and not kept. ``ids`` may list a request twice (a dummy warm-up replays the first batch)."""

    def __init__(self, ids: list[int], read: Callable[[int], RequestArrays], loaded: dict | None = None):
        self.ids, self._read, self._loaded = list(ids), read, loaded or {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        return self.request(self.ids[i])

    def request(self, rid: int) -> RequestArrays:
        """Request ``rid``, from ``loaded`` where it is there, else read."""
        r = self._loaded.get(rid)
        return r if r is not None else self._read(rid)


def replay_order(
    ids: list[int], batch_size: int, warmup_requests: int, dummy_warmup: bool
) -> tuple[list, int]:
    """The requests a run replays in order, and how many of them lead unmeasured: with ``dummy_warmup`` the first
    batch is replayed once more, unmeasured, before the rest."""
    if dummy_warmup:
        return list(ids[:batch_size]) + list(ids), warmup_requests + batch_size
    return list(ids), warmup_requests


class ActivationOracle:
    """Future accesses of a run (for clairvoyant policies only): next forward using (layer, expert).

    A dense table ``[F, L, E]`` (int32) of the next activating forward, built by one backward scan.
    """

    NEVER = np.iinfo(np.int32).max

    def __init__(self, forwards: Iterable[BatchedForward]):
        used = [f.counts > 0 for f in forwards]  # one pass: a stream of forwards is read once
        F = len(used)
        L, E = used[0].shape if used else (0, 0)
        self._next = np.empty((F, L, E), np.int32)
        nxt = np.full((L, E), self.NEVER, np.int32)
        for f in range(F - 1, -1, -1):
            self._next[f] = nxt
            nxt = np.where(used[f], np.int32(f), nxt)
        self._first = nxt  # next use before forward 0

    def next_uses_all(self, after_forward: int) -> np.ndarray:
        """``[L, E]`` next activating forward after ``after_forward`` at every layer (NEVER if none)."""
        return self._first if after_forward < 0 else self._next[after_forward]

    def next_uses(self, layer: int, after_forward: int) -> np.ndarray:
        """``[E]`` next activating forward after ``after_forward`` at ``layer`` (NEVER if none)."""
        return self._first[layer] if after_forward < 0 else self._next[after_forward, layer]

    def next_use(self, layer: int, expert: int, after_forward: int) -> float:
        v = int(self.next_uses(layer, after_forward)[expert])
        return float("inf") if v == self.NEVER else float(v)
