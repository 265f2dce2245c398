"""Shared fixtures: small synthetic traces written into tmp dirs."""

from __future__ import annotations

import pytest

from traces.synth import SynthConfig, write_synthetic_trace


@pytest.fixture(scope="session")
def small_trace(tmp_path_factory):
    """A 2-request mini-topology trace with 64 new tokens each."""
    out = tmp_path_factory.mktemp("traces") / "small"
    return write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=64, prompt_len_min=20, prompt_len_max=60,
                                             seed=7), out)
