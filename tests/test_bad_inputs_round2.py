"""The audit's second round of configs and arguments that measured nothing, ran unbounded or gave a traceback, each
now refused with the field and value (N-SC17, N-MS05, N-CF21, N-CF22, N-TR15, N-SC01, N-SC02, N-SC03, N-SC06)."""

from __future__ import annotations

import json
import shutil

import pytest

from dllm_offload_sim.sim.app import run_table
from dllm_offload_sim.traces.cli import run_cli
from dllm_offload_sim.traces.errors import TraceError
from dllm_offload_sim.traces.reader import Trace
from dllm_offload_sim.traces.synth import SynthConfig, main as synth, write_synthetic_trace
from dllm_offload_sim.wiring.errors import ConfigError

from test_configs import _compose


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    return write_synthetic_trace(SynthConfig(n_requests=2, max_new_tokens=16, seed=0), tmp_path_factory.mktemp("r") / "t")


@pytest.mark.parametrize("overrides,message", [
    (["policy=lru", "cache=40", "sim.warmup_requests=1", "sim.batch_size=2"], "measures nothing"),  # N-SC17
    (["table.policies=[lru,naive_lru]", "table.caches=[40]", "table.baseline=naive_lruu"],
     "table.baseline='naive_lruu' is not a policy"),  # N-MS05
    (["table.caches=[]", "table.policies=[lru]"], "table.caches is empty"),  # N-CF21
    (["table.policies=[]"], "table.policies is empty"),  # N-CF22
])
def test_a_config_that_would_measure_nothing_is_refused(trace, overrides, message):
    with pytest.raises(ConfigError, match=message):
        run_table(_compose(*overrides, f"trace.path={trace}"), progress=False)


def test_a_topology_field_of_the_wrong_type_is_named(trace, tmp_path):
    """N-TR15: meta model.n_experts "256" (a string)."""
    t = tmp_path / "t"
    shutil.copytree(trace, t)
    meta = json.loads((t / "meta.json").read_text())
    meta["model"]["n_experts"] = "256"
    (t / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(TraceError, match="n_experts='256' must be an integer"):
        Trace.open(t)


@pytest.mark.parametrize("args,message", [
    (["--n-requests", "100000000"], "GB free; nothing was written"),  # N-SC01, at 100x: more than any disk holds
    (["--n-requests", "1", "--max-new-tokens", "10000000000"], "GB free; nothing was written"),  # N-SC02, at 100x
    (["--n-requests", "1", "--prompt-len-min", "10000000", "--prompt-len-max", "10000000"], "GiB of routing"),  # N-SC03
    (["--seed", "-1"], "seed=-1"),  # N-SC06
])
def test_synth_refuses_what_it_cannot_write_before_writing(tmp_path, capsys, args, message):
    assert run_cli(synth, [*args, "--out", str(tmp_path / "t"), "--quiet"]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing, not even a partial
