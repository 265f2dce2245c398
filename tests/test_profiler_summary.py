"""What dllm-profile prints about the profile it wrote: an expert's copy, the CPU curve, and the CPU points that cost
less per expert than streaming the expert's weights from host memory."""

from dllm_offload_sim.profiler.summary import profile_summary, suspect_cpu_points
from tests.simkit import flat_profile, tiny_topology


def test_a_cpu_point_cheaper_than_streaming_the_experts_weights_is_named():
    topo = tiny_topology()
    prof = flat_profile(topo, cpu_per_token_s=1e-3, cpu_call_overhead_s=5e-4)
    eb = topo.expert_bytes
    assert suspect_cpu_points(prof) == []  # no host bandwidth measured: nothing to compare with
    gbps = eb / 2e-3 / 1e9  # streaming an expert takes 2 ms; the curve's points are 1 ms and 1.024 s per expert
    prof.stamp["host_probe"] = {"before": {"mem_gbps": gbps * 2}, "after": {"mem_gbps": gbps}}  # the lower counts
    (bad,) = suspect_cpu_points(prof)
    assert bad.startswith("cpu_expert at 1 tokens: 1000 us per expert, below the 2000 us")
    lines = profile_summary(prof)
    assert lines[0].startswith("H2D: one expert") and "0.500 ms per call" in lines[1]
    assert lines[2] == f"warning: {bad}" and "cannot be right" in lines[3]
    prof.stamp["host_probe"]["after"]["mem_gbps"] = gbps * 4  # streaming now takes 1 ms: 1 ms is no longer below 0.8 ms
    assert suspect_cpu_points(prof) == [] and len(profile_summary(prof)) == 2


def test_the_cpu_bands_are_printed_under_the_curve():
    prof = flat_profile(tiny_topology(), cpu_per_token_s=1e-3)
    prof.curves["cpu_expert"]["bands"] = [{"after": 8, "seconds": [5e-4, 0.512]}, {"after": 32, "seconds": [2e-4, 0.2]}]
    lines = profile_summary(prof)
    assert lines[2:] == ["  each expert beyond 8 in a call: 500, 512000 us", "  each expert beyond 32 in a call: 200, 200000 us"]
