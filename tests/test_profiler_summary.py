"""What dllm-profile prints about the profile it wrote: an expert's copy, the CPU curve, the CPU points that cost
less per expert than streaming the expert's weights from host memory, and whether the host moved meanwhile."""

from dllm_offload_sim.profiler.summary import host_moved, profile_summary, suspect_cpu_points
from tests.simkit import flat_profile, tiny_topology


def test_a_cpu_point_cheaper_than_streaming_the_experts_weights_is_named():
    topo = tiny_topology()
    prof = flat_profile(topo, cpu_per_token_s=1e-3, cpu_call_overhead_s=5e-4)
    eb = topo.expert_bytes
    assert suspect_cpu_points(prof) == []  # no host bandwidth measured: nothing to compare with
    # streaming an expert takes 2 ms; the curve's points are 1 ms and 1.024 s per expert
    gbps = eb / 2e-3 / 1e9
    prof.stamp["host_probe"] = {"before": {"mem_gbps": gbps}, "after": {"mem_gbps": gbps * 1.1}}
    (bad,) = suspect_cpu_points(prof)
    assert bad.startswith(
        "cpu_expert at 1 tokens: 1000 us per expert, below the 1818 us"
    )  # the fastest probe counts
    lines = profile_summary(prof)
    assert lines[0].startswith("H2D: one expert") and "0.500 ms per call" in lines[1]
    assert lines[2] == f"warning: {bad}" and "cannot be right" in lines[3] and len(lines) == 4
    assert host_moved(prof) is None  # 10% apart: the host held still
    # streaming now takes 0.5 ms: 1 ms is no longer below 0.4 ms
    prof.stamp["host_probe"]["after"]["mem_gbps"] = gbps * 4
    assert suspect_cpu_points(prof) == []
    lines = profile_summary(prof)
    assert len(lines) == 3 and lines[2].startswith("warning: the host's memory bandwidth moved")


def test_the_cpu_bands_are_printed_under_the_curve():
    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3)
    prof.curves["cpu_expert"]["bands"] = [
        {"after": 8, "seconds": [5e-4, 0.512]},
        {"after": 32, "seconds": [2e-4, 0.2]},
    ]
    lines = profile_summary(prof)
    assert lines[2:] == [
        "  each expert beyond 8 in a call: 500, 512000 us",
        "  each expert beyond 32 in a call: 200, 200000 us",
    ]


def test_the_host_moving_while_profiled_is_named_with_the_bandwidth_the_cpu_curve_was_timed_at():
    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3)
    assert prof.memory_probes_gbps() == [] and prof.cpu_curve_gbps() is None and host_moved(prof) is None
    prof.stamp["host_probe"] = {"before": {"mem_gbps": 80.0}, "after": {"mem_gbps": 130.0}}
    assert prof.cpu_curve_gbps() == 105.0  # no probes around the curve: the host probes' median
    prof.curves["cpu_expert"]["mem_gbps"] = [90.0, 100.0]
    assert prof.memory_probes_gbps() == [80.0, 90.0, 100.0, 130.0] and prof.cpu_curve_gbps() == 95.0
    assert host_moved(prof) == (
        "the host's memory bandwidth moved while this profile was measured: 80.0, 90.0, 100.0, "
        "130.0 GB/s (in time order; the CPU expert curve at 95.0). CPU-path predictions follow "
        "the speed the curve was timed at; a validation run reports the host's bandwidth beside it"
    )


def test_the_runtimes_terms_are_printed_in_microseconds_where_the_profile_has_them():
    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3)
    assert not any(x.startswith("runtime") for x in profile_summary(prof))
    prof.runtime = {"routing_sync_s": 6e-6, "cpu_busy_gpu_s": 2.5e-4, "policy_time_factor": 1.43}
    (line,) = [x for x in profile_summary(prof) if x.startswith("runtime")]
    assert line == "runtime (us): routing sync 6.0, busy GPU per CPU call 250.0; policy-time factor 1.43"
    prof.runtime["bookkeeping_cpu_s"] = 7e-5
    (line,) = [x for x in profile_summary(prof) if x.startswith("runtime")]
    assert "busy GPU per CPU call 250.0, bookkeeping beside the CPU engine 70.0; policy" in line
    prof.runtime.update(
        {"cpu_slowdown_beside_copies": 0.12, "copies_slowdown_beside_cpu": 0.1}
    )  # ratios, not us
    (line,) = [x for x in profile_summary(prof) if x.startswith("runtime")]
    assert line.endswith(
        "70.0; a CPU call's slowdown beside copies 0.12; copies' slowdown beside a CPU call 0.10; "
        "policy-time factor 1.43"
    )


def test_a_measured_profile_from_before_the_newer_runtime_terms_is_named():
    """dllm-validate warns where a measured profile lacks runtime.forward_residual_s, cpu_busy_gpu_s, grouped_issue_s,
    cpu_slowdown_beside_copies or bookkeeping_cpu_s, one line each; an estimate (no runtime section) and a profile with
    the terms pass."""
    from dllm_offload_sim.profiler.summary import missing_runtime_terms

    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3)
    prof.runtime = {}
    assert missing_runtime_terms(prof) == []
    prof.runtime = {"cpu_issue_s": 6e-5}
    forward, busy, grouped, shared, beside = missing_runtime_terms(prof)
    assert forward.startswith("no runtime.forward_residual_s") and "once per layer" in forward
    prof.runtime["forward_residual_s"] = 0.0
    busy, grouped, shared, beside = missing_runtime_terms(prof)
    assert busy.startswith("no runtime.cpu_busy_gpu_s") and "profile again" in busy
    assert grouped.startswith("no runtime.grouped_issue_s")
    assert shared.startswith("no runtime.cpu_slowdown_beside_copies") and "one shared slowdown" in shared
    assert beside.startswith("no runtime.bookkeeping_cpu_s") and "beside the CPU expert engine" in beside
    prof.runtime["cpu_busy_gpu_s"] = 0.0
    prof.runtime["bookkeeping_cpu_s"] = 4e-5
    prof.runtime["cpu_slowdown_beside_copies"] = 0.1
    (line,) = missing_runtime_terms(prof)
    assert line.startswith("no runtime.grouped_issue_s")
    prof.runtime["grouped_issue_s"] = 9e-5
    assert missing_runtime_terms(prof) == []


def test_the_profiler_keeps_an_existing_file_unless_asked_to_replace_it(tmp_path, capsys):
    """``dllm-profile --out FILE`` where FILE exists stops before measuring, naming the file and ``--overwrite``."""
    from dllm_offload_sim.profiler.__main__ import main

    out = tmp_path / "cpu-mini.measured.json"
    out.write_text("a profile the user keeps")
    assert main(["--device", "cpu", "--out", str(out)]) == 2
    assert f"{out} exists; pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "a profile the user keeps"
