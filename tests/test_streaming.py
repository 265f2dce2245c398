"""Streamed forwards: a run reads each batch's requests when the batch begins, makes forwards in bounded runs, and
builds offline knowledge lazily; its results equal those of the requests loaded up front."""

from __future__ import annotations

import numpy as np
import pytest

from dllm_offload_sim.policies.finemoe import FineMoEPolicy
from dllm_offload_sim.policies.naive_lru import NaiveLRUPolicy
from dllm_offload_sim.schedule import batch as batch_mod
from dllm_offload_sim.schedule.batch import RequestSource, batched_forwards
from dllm_offload_sim.schedule.knowledge import ForwardMaps, request_maps, request_profile
from dllm_offload_sim.sim import run as run_mod
from dllm_offload_sim.sim.run import simulate
from dllm_offload_sim.traces.reader import Trace
from tests.simkit import assert_same_request, flat_cost, random_request, tiny_topology, write_requests


def _trace(tmp_path, n_requests=4, n_forwards=7, rows=3):
    topo = tiny_topology(n_moe=3, n_experts=8)
    rng = np.random.default_rng(5)
    reqs = [random_request(rng, i, topo, n_forwards, rows) for i in range(n_requests)]
    return topo, Trace.open(write_requests(tmp_path / "trace", topo, reqs))


def test_a_batch_reads_its_requests_when_it_begins(tmp_path):
    topo, tr = _trace(tmp_path)
    reads = []

    def read(rid):
        reads.append(rid)
        return tr.request(rid)

    src = RequestSource(tr.request_ids, read)
    seen = []
    for f in batched_forwards(src, 2, topo.n_experts):
        seen.append((f.batch, list(reads)))
    # batch 0's forwards exist after reading requests 0 and 1 only; batch 1's after 2 and 3
    assert {tuple(r) for b, r in seen if b == 0} == {(0, 1)}
    assert {tuple(r) for b, r in seen if b == 1} == {(0, 1, 2, 3)}


def test_a_request_source_serves_loaded_requests_without_reading(tmp_path):
    topo, tr = _trace(tmp_path)
    loaded = {0: tr.request(0)}

    def read(rid):
        if rid == 0:
            raise AssertionError("request 0 was given loaded")
        return tr.request(rid)

    src = RequestSource([0, 0, 1], read, loaded)
    assert len(src) == 3
    assert src[0] is loaded[0] and src[1] is loaded[0]
    assert_same_request(src[2], tr.request(1))
    assert [r.request_id for r in src[1:]] == [0, 1]


@pytest.mark.parametrize("chunk_bytes", [1, 8 * 3 * 8 * 2, 1 << 30])
def test_forwards_made_in_runs_equal_forwards_made_whole(tmp_path, monkeypatch, chunk_bytes):
    """Runs of 1, 2 and every forward of a request (``CHUNK_BYTES``) make the same forwards."""
    topo, tr = _trace(tmp_path)
    reqs = [tr.request(r) for r in tr.request_ids]
    whole = list(batched_forwards(reqs, 1, topo.n_experts, warmup_requests=1))
    monkeypatch.setattr(batch_mod, "CHUNK_BYTES", chunk_bytes)
    runs = list(batched_forwards(reqs, 1, topo.n_experts, warmup_requests=1))
    assert len(runs) == len(whole)
    for a, b in zip(runs, whole):
        assert (a.index, a.batch, a.phase, a.n_tokens, a.measured, a.decoded) == (
            b.index,
            b.batch,
            b.phase,
            b.n_tokens,
            b.measured,
            b.decoded,
        )
        for name in ("counts", "ids_by_layer", "weights_by_layer", "_es", "_tok", "prev_confidence"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
        assert a._cut == b._cut


def test_forward_maps_are_made_when_first_read(tmp_path):
    topo, tr = _trace(tmp_path)
    profiles = [request_profile(tr.request(r), topo) for r in tr.request_ids]
    reads = []

    def read(rid):
        reads.append(rid)
        return tr.request(rid)

    maps = ForwardMaps(profiles, read, topo)
    assert reads == [] and len(maps) == sum(p.n_decode for p in profiles)
    every = [m for r in tr.request_ids for m in request_maps(tr.request(r), topo)]
    last = maps[len(maps) - 1]
    assert reads == [tr.request_ids[-1]]  # only the request that map belongs to
    np.testing.assert_array_equal(last, every[-1])
    for a, b in zip(maps, every):
        np.testing.assert_array_equal(a, b)
    assert sorted(reads) == sorted(tr.request_ids)  # each request read once: its maps are kept in its profile
    np.testing.assert_array_equal(maps[-1], every[-1])
    with pytest.raises(IndexError):
        maps[len(maps)]


@pytest.mark.parametrize("policy", [NaiveLRUPolicy, lambda: FineMoEPolicy(prefetch_distance=0)])
@pytest.mark.parametrize("batch_size", [1, 2])
def test_a_streamed_run_equals_a_run_on_loaded_requests(tmp_path, monkeypatch, policy, batch_size):
    """A run that reads each batch's requests as it begins (any trace over ``READ_WHOLE_ROWS``) equals one handed
    every request loaded."""
    topo, tr = _trace(tmp_path)
    reads = []
    read = tr.request

    def counted(rid):
        reads.append(rid)
        return read(rid)

    monkeypatch.setattr(run_mod, "READ_WHOLE_ROWS", 0)
    monkeypatch.setattr(tr, "request", counted)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    loaded = [read(r) for r in tr.request_ids]
    a = simulate(tr, policy(), 3, cost, batch_size=batch_size, dummy_warmup=True)
    assert len(reads) > len(tr.request_ids)  # streamed: profiled first, then read again as batches begin
    b = simulate(tr, policy(), 3, cost, batch_size=batch_size, dummy_warmup=True, loaded=loaded)
    assert a.summary["ttft_ms"] == b.summary["ttft_ms"] and np.isfinite(a.summary["ttft_ms"])
    for k in ("tpot_ms", "hits", "h2d_count", "forwards"):
        assert a.summary[k] == b.summary[k], k
    np.testing.assert_array_equal(a.per_forward.to_numpy(), b.per_forward.to_numpy())


def test_a_small_trace_is_read_once(tmp_path):
    """Under ``READ_WHOLE_ROWS`` routing rows a run reads each request once, before it starts."""
    topo, tr = _trace(tmp_path)
    reads = []
    read = tr.request
    tr.request = lambda rid: reads.append(rid) or read(rid)
    simulate(tr, NaiveLRUPolicy(), 3, flat_cost(topo, h2d_latency_s=1e-4), batch_size=2)
    assert sorted(reads) == sorted(tr.request_ids)


def test_runs_sharing_their_forwards_equal_runs_that_make_their_own(tmp_path):
    """Forwards made once and shared by every run of a group (``forwards_cache``) are not changed by a run: each
    policy, run after all the others on the shared forwards, gives what it gives on forwards of its own."""
    from tests.test_sim_invariants import ALL

    topo, tr = _trace(tmp_path)
    cost = flat_cost(topo, h2d_latency_s=1e-4)
    loaded = [tr.request(r) for r in tr.request_ids]
    shared, know = {}, {}
    for name in sorted(ALL) * 2:  # a second round on forwards every policy has run over
        a = simulate(
            tr, ALL[name](), 3, cost, loaded=loaded, knowledge=know, forwards_cache=shared, dummy_warmup=True
        )
        b = simulate(tr, ALL[name](), 3, cost, loaded=loaded, dummy_warmup=True)
        np.testing.assert_array_equal(a.per_forward.to_numpy(), b.per_forward.to_numpy(), err_msg=name)
    assert len(shared) == 2  # the forwards, and the future the clairvoyant policies read
