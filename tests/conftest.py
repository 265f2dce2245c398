"""Shared fixtures: small synthetic traces written into tmp dirs."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    """GPU-marked tests are skipped where no CUDA device is visible."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory):
    """A 2-request mini-topology trace with 64 new tokens each."""
    from dllm_offload_sim.traces.synth import SynthConfig, write_synthetic_trace

    out = tmp_path_factory.mktemp("traces") / "small"
    return write_synthetic_trace(
        SynthConfig(n_requests=2, max_new_tokens=64, prompt_len_min=20, prompt_len_max=60, seed=7), out
    )
