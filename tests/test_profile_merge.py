"""Merging profiling runs: the point-wise median of every curve and runtime term; runs that measured
different things are refused, naming the file and field."""

import json

import numpy as np
import pytest

from dllm_offload_sim.costmodel.merge import main, merge_profiles
from dllm_offload_sim.costmodel.profile import ProfileError, load_profile

FIXTURE = "tests/fixtures/h200-mini.eager.json"


def _scaled(tmp_path, name, factor, runtime=None, **stamp):
    d = json.loads(open(FIXTURE).read())
    for k in ("h2d", "cpu_expert", "cpu_dispatch", "per_forward", "gpu_experts", "non_expert", "dense_layer"):
        d[k]["seconds"] = (np.asarray(d[k]["seconds"]) * factor).tolist()
    if name == "nodev":
        d.pop("gpu_experts_device", None)
    d["cpu_expert"]["call_overhead_s"] = 1e-4 * factor
    if runtime is not None:
        d["runtime"] = runtime
    d["stamp"].update(stamp)
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(d))
    return p


def test_merge_is_the_pointwise_median_of_curves_and_runtime_terms(tmp_path):
    runs = [
        load_profile(_scaled(tmp_path, n, f, rt, host_launch_us=h))
        for n, f, rt, h in (
            ("a", 1.0, {"bookkeeping_s": 3e-5}, 7.0),
            ("b", 1.5, {"bookkeeping_s": 5e-5, "cpu_stall_per_copy_s": 2e-5}, 10.0),
            ("c", 1.1, {"bookkeeping_s": 4e-5}, 11.0),
        )
    ]
    m = merge_profiles(runs, name="merged")
    base = load_profile(FIXTURE)
    np.testing.assert_allclose(
        m.h2d["seconds"], np.asarray(base.h2d["seconds"]) * 1.1
    )  # median of 1, 1.5, 1.1
    np.testing.assert_allclose(
        m.curves["gpu_experts"]["seconds"], np.asarray(base.curves["gpu_experts"]["seconds"]) * 1.1
    )
    assert m.curves["cpu_expert"]["call_overhead_s"] == pytest.approx(1.1e-4)
    assert m.runtime == {
        "bookkeeping_s": pytest.approx(4e-5),
        "cpu_stall_per_copy_s": pytest.approx(2e-5),
    }  # one run had it
    assert m.stamp["host_launch_us"] == 10.0 and len(m.stamp["merged_from"]) == 3 and m.name == "merged"
    assert "mem_gbps" not in m.curves["cpu_expert"]  # the runs measured no host bandwidth
    out = tmp_path / "m.json"
    m.save(out)
    assert load_profile(out).status == "measured"  # a valid profile file


def test_runs_of_different_things_are_refused(tmp_path, capsys):
    a = _scaled(tmp_path, "a", 1.0)
    d = json.loads(a.read_text())
    d["cpu_expert"]["threads"] = 8
    (tmp_path / "t8.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="cpu_expert.threads"):
        merge_profiles([load_profile(a), load_profile(tmp_path / "t8.json")])
    d = json.loads(a.read_text())
    d["cpu_expert"]["engine"] = "kt"  # the native engine's curve against the reference's
    (tmp_path / "kt.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"cpu_expert\.engine': is 'kt', but 'torch'"):
        merge_profiles([load_profile(a), load_profile(tmp_path / "kt.json")])
    d = json.loads(a.read_text())
    d["h2d"]["copies_per_expert"] = 1  # a runtime that copies an expert in one operation against one in two
    (tmp_path / "one.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=r"h2d\.copies_per_expert': is 1, but 2"):
        merge_profiles([load_profile(a), load_profile(tmp_path / "one.json")])
    d = json.loads(a.read_text())
    d["stamp"]["dtype"] = "float32"
    (tmp_path / "f32.json").write_text(json.dumps(d))
    with pytest.raises(ProfileError, match="stamp.dtype"):
        merge_profiles([load_profile(a), load_profile(tmp_path / "f32.json")])
    with pytest.raises(ValueError, match="at least two"):
        merge_profiles([load_profile(a)])
    assert main([str(a), str(tmp_path / "t8.json"), "--out", str(tmp_path / "x.json")]) == 2
    assert (
        "t8.json, field 'cpu_expert.threads'" in capsys.readouterr().err
        and not (tmp_path / "x.json").exists()
    )


def test_an_optional_curve_is_kept_only_where_every_run_has_it(tmp_path):
    assert "gpu_experts_device" in load_profile(FIXTURE).curves
    m = merge_profiles(
        [load_profile(_scaled(tmp_path, "a", 1.0)), load_profile(_scaled(tmp_path, "nodev", 1.0))]
    )
    assert "gpu_experts_device" not in m.curves


def test_merge_takes_the_median_of_cpu_bands_where_every_run_has_them(tmp_path):
    def banded(name, factor, with_bands=True):
        p = _scaled(tmp_path, name, factor)
        d = json.loads(p.read_text())
        n = len(d["cpu_expert"]["tokens"])
        if with_bands:
            d["cpu_expert"]["bands"] = [
                {"after": 8, "seconds": [5e-5 * factor] * n},
                {"after": 32, "seconds": [2e-5 * factor] * n},
            ]
        p.write_text(json.dumps(d))
        return load_profile(p)

    m = merge_profiles([banded("a", 1.0), banded("b", 1.5), banded("c", 1.1)], name="m")
    assert [b["after"] for b in m.curves["cpu_expert"]["bands"]] == [8, 32]
    np.testing.assert_allclose(m.curves["cpu_expert"]["bands"][0]["seconds"], 5.5e-5)
    np.testing.assert_allclose(m.curves["cpu_expert"]["bands"][1]["seconds"], 2.2e-5)
    # a run without bands: the merge has none (its later experts cost the curve, as that run's would)
    assert (
        "bands"
        not in merge_profiles([banded("d", 1.0), banded("e", 1.5, with_bands=False)]).curves["cpu_expert"]
    )


def test_the_merged_cpu_curve_is_stamped_with_the_median_bandwidth_its_runs_were_timed_at(tmp_path):
    paths = [_scaled(tmp_path, n, 1.0) for n in ("a", "b", "c")]
    for p, g in zip(paths, ([80.0, 90.0], [120.0], [100.0, 100.0])):
        d = json.loads(p.read_text())
        d["cpu_expert"]["mem_gbps"] = g
        p.write_text(json.dumps(d))
    m = merge_profiles([load_profile(p) for p in paths])
    assert (
        m.curves["cpu_expert"]["mem_gbps"] == [100.0] and m.cpu_curve_gbps() == 100.0
    )  # median of 85, 120, 100
