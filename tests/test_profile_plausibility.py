"""A profile in other units, with a misspelt field or a malformed curve is refused, naming the file and field (the
audit's N-PR05, N-PR06, N-PR07, N-PR09, N-PR10, N-PR12, N-PR13, N-PR16, N-PR17, N-PR27): before, each was accepted
and gave a silently wrong TPOT, or a traceback."""

from __future__ import annotations

import copy
import json

import pytest

from dllm_offload_sim.costmodel.profile import PROFILE_DIR, ProfileError, load_profile

BASE = json.loads((PROFILE_DIR / "h100-mini.measured.json").read_text())
CURVES = (
    "gpu_experts",
    "gpu_experts_device",
    "cpu_expert",
    "cpu_dispatch",
    "non_expert",
    "dense_layer",
    "per_forward",
)


def _scaled(d, f):
    for c in CURVES:
        s = d[c]["seconds"]
        d[c]["seconds"] = (
            [[v * f for v in row] for row in s] if isinstance(s[0], list) else [v * f for v in s]
        )
    d["h2d"]["seconds"] = [v * f for v in d["h2d"]["seconds"]]
    return d


def _mib(d):
    d["h2d"]["bytes"] = [b / 2**20 for b in d["h2d"]["bytes"]]
    return d


def _rename(old, new):
    def f(d):
        d[new] = d.pop(old)
        return d

    return f


def _set(path, value):
    def f(d):
        node = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return d

    return f


CASES = {
    "N-PR05 times in ms": (lambda d: _scaled(d, 1e3), r"more than any one operation takes|GB/s"),
    "N-PR06 times in us": (lambda d: _scaled(d, 1e6), r"more than any one operation takes|GB/s"),
    "N-PR07 h2d bytes in MiB": (_mib, r"h2d.bytes.*under half an expert"),
    "N-PR09 top level a list": (lambda d: [d], r"<top level>.*must be a JSON object"),
    "N-PR10 runtime misspelt": (_rename("runtime", "runtme"), r"'runtme'.*did you mean 'runtime'"),
    "N-PR27 device curve misspelt": (
        _rename("gpu_experts_device", "gpu_expert_device"),
        r"'gpu_expert_device'.*did you mean 'gpu_experts_device'",
    ),
    "N-PR12 policy time NaN": (_set(["policy_per_layer_s"], float("nan")), r"policy_per_layer_s.*finite"),
    "N-PR13 policy time Infinity": (
        _set(["policy_per_layer_s"], float("inf")),
        r"policy_per_layer_s.*finite",
    ),
    "N-PR16 a string in a curve": (
        lambda d: _set(["non_expert", "seconds", 0, 0], "abc")(d),
        r"non_expert.seconds.*must be numbers",
    ),
    "N-PR17 a ragged curve row": (
        lambda d: _set(["gpu_experts", "seconds", 1], d["gpu_experts"]["seconds"][1][:-1])(d),
        r"gpu_experts.seconds.*must be numbers",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_profile_is_refused_by_file_and_field(tmp_path, case):
    edit, message = CASES[case]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(edit(copy.deepcopy(BASE))))
    with pytest.raises(ProfileError, match=message) as e:
        load_profile(path)
    assert str(path) in str(e.value)


def test_every_shipped_profile_is_plausible():
    for p in sorted(PROFILE_DIR.glob("*.json")):
        load_profile(p)


def test_dllm_sim_names_the_field_in_one_line(tmp_path):
    """N-PR09 and N-PR10 through the simulator's command: one error line, exit 2, no traceback."""
    import subprocess
    import sys

    for i, d in enumerate(([BASE], _rename("runtime", "runtme")(copy.deepcopy(BASE)))):
        path = tmp_path / f"p{i}.json"
        path.write_text(json.dumps(d))
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "dllm_offload_sim.sim",
                "quiet=true",
                "policy=lru",
                "cache=40",
                f"hw.profile={path}",
                f"hydra.run.dir={tmp_path / f'run{i}'}",
                "trace.requests=[0]",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 2 and "Traceback" not in p.stderr and str(path) in p.stderr, p.stderr[-1500:]
