"""A measured profile's CPU curve fitted again from the calls it stores (``dllm-profile --refit``)."""

import json
from pathlib import Path

import pytest

from dllm_offload_sim.costmodel.profile import PROFILE_DIR, ProfileError, load_profile
from dllm_offload_sim.profiler.__main__ import main
from dllm_offload_sim.profiler.refit import refit_cpu_expert

# the H200 lease profile behind the shipped h200-mini before its refit (fitted by the slope from 1 to 8 experts)
LEASE37 = Path(__file__).resolve().parent.parent / "validation" / "h200" / "profile-mini.json"


def test_a_refit_keeps_the_decode_sized_points_and_gives_the_starved_points_the_many_expert_average():
    """The H200 lease profile was fitted with a slope of nothing at 32-128 tokens (kt-kernel's 1-expert calls as
    slow as its 8-expert ones there); fitted again from its stored calls those points cost the 8-expert call's average,
    the decode-sized points and the fixed cost stay, and nothing measured changes. The shipped h200-mini is that
    profile refitted."""
    old = load_profile(str(LEASE37))
    new = refit_cpu_expert(old)
    o, n = old.curves["cpu_expert"], new.curves["cpu_expert"]
    small = [i for i, t in enumerate(o["tokens"]) if t <= 16]
    assert [n["seconds"][i] for i in small] == pytest.approx([o["seconds"][i] for i in small])
    assert n["call_overhead_s"] == pytest.approx(o["call_overhead_s"])
    starved = [i for i, t in enumerate(o["tokens"]) if 32 <= t <= 128]
    assert all(o["seconds"][i] < 1e-5 for i in starved)  # what the old fit gave
    calls = o["calls"]
    for i in (
        starved
    ):  # at least the 8-expert call beyond the fixed cost, per expert, and below the whole call's share
        assert 0 < n["seconds"][i] < calls["many_s"][i] / calls["many_experts"][i]
    assert (
        n["calls"] == o["calls"]
        and new.curves["cpu_dispatch"] == old.curves["cpu_dispatch"]
        and new.h2d == old.h2d
    )
    assert "Refitted" in new.notes and "Refitted" not in old.notes
    shipped = load_profile("h200-mini").curves["cpu_expert"]
    assert shipped["seconds"] == pytest.approx(n["seconds"]) and shipped["call_overhead_s"] == pytest.approx(
        n["call_overhead_s"]
    )


def test_the_refit_command_writes_a_loadable_profile_and_refuses_what_it_cannot_refit(tmp_path, capsys):
    """The command writes a profile the simulator loads; it needs --out, and an estimated profile (no timed calls)
    is refused with the field named, nothing written."""
    out, estimated = tmp_path / "refit.json", str(PROFILE_DIR / "h200-mini.estimated.json")
    assert main(["--refit", "h200-mini", "--out", str(out)]) == 0
    prof = load_profile(str(out))
    assert prof.curves["cpu_expert"]["seconds"][5] > 1e-5 and "wrote" in capsys.readouterr().out
    assert main(["--refit", "h200-mini"]) == 2 and "needs --out" in capsys.readouterr().err
    assert main(["--refit", estimated, "--out", str(tmp_path / "e.json")]) == 2
    assert "cpu_expert.calls" in capsys.readouterr().err and not (tmp_path / "e.json").exists()
    with pytest.raises(ProfileError, match="cpu_expert.calls"):
        refit_cpu_expert(load_profile(estimated))
    assert json.loads(out.read_text())["cpu_expert"]["calls"]["many_experts"][0] == 8
