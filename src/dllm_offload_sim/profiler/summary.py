"""What ``dllm-profile`` says about the profile it wrote: the numbers a validation depends on most, the points of
the CPU expert curve that cannot be right, and whether the host moved while it was measured.

An expert run on the CPU reads all its weights from host memory, so no point of the curve can cost less per expert
than streaming them at the host's bandwidth (the fastest the profile's probes measured). A point far below that means
the timed calls were not what they seemed (an engine that stalled its one-expert calls, say), and every CPU-path
prediction made with the profile would be wrong; the summary names such points before a sweep spends device time.
On a shared VM the bandwidth itself moves; where the probes disagree by more than ``MOVED_RATIO`` the summary says so,
since the CPU curve then holds whichever speed the host had while it was timed.
"""

from __future__ import annotations

from dllm_offload_sim.costmodel.profile import HardwareProfile
from dllm_offload_sim.costmodel.runtime_terms import RUNTIME_TERMS

BELOW_STREAMING = 0.8  # a CPU point under this share of the weights' streaming time is flagged
MOVED_RATIO = 1.25  # the profile's memory probes this far apart: the host moved while it was measured
RUNTIME_LINE = tuple((t.label, t.name) for t in RUNTIME_TERMS if t.unit == "s")
RATIO_LINE = tuple((t.label, t.name) for t in RUNTIME_TERMS if t.unit == "ratio")
# runtime terms newer than some measured profiles: what the simulator does without each
NEWER_TERMS = {t.name: t.without for t in RUNTIME_TERMS if t.without}


def host_bandwidth_gbps(prof: HardwareProfile) -> float | None:
    """The fastest host memory bandwidth the profile's probes measured (GB/s), or None where it has none: no expert
    can stream faster than that."""
    seen = prof.memory_probes_gbps()
    return max(seen) if seen else None


def host_moved(prof: HardwareProfile) -> str | None:
    """A line saying how far the host's memory bandwidth moved while the profile was measured, where its probes
    disagree by more than ``MOVED_RATIO``; None otherwise."""
    seen = prof.memory_probes_gbps()
    if len(seen) < 2 or max(seen) <= MOVED_RATIO * min(seen):
        return None
    at = prof.cpu_curve_gbps()
    return (
        f"the host's memory bandwidth moved while this profile was measured: {', '.join(f'{v:.1f}' for v in seen)} "
        f"GB/s (in time order; the CPU expert curve at {at:.1f}). CPU-path predictions follow the speed the curve "
        f"was timed at; a validation run reports the host's bandwidth beside it"
    )


def missing_runtime_terms(prof: HardwareProfile) -> list[str]:
    """A line for each runtime term a measured profile lacks because it was measured before ``dllm-profile`` took it
    (the simulator charges such a term nothing); none for a profile without a runtime section (an estimate)."""
    rt = prof.runtime or {}
    if not rt:
        return []
    return [
        f"no runtime.{k} (this profile predates it): {what}; profile again to measure it"
        for k, what in NEWER_TERMS.items()
        if k not in rt
    ]


def suspect_cpu_points(prof: HardwareProfile) -> list[str]:
    """The CPU expert curve's points that cost less per expert than ``BELOW_STREAMING`` x the time to stream an
    expert's weights from host memory, one line each; none where the profile has no host bandwidth."""
    gbps = host_bandwidth_gbps(prof)
    if not gbps:
        return []
    stream_s = prof.model_shape["expert_bytes"] / (gbps * 1e9)
    c = prof.curves["cpu_expert"]
    return [
        f"cpu_expert at {t} tokens: {s * 1e6:.0f} us per expert, below the {stream_s * 1e6:.0f} us its weights "
        f"take to stream from host memory at {gbps:.1f} GB/s"
        for t, s in zip(c["tokens"], c["seconds"])
        if s < BELOW_STREAMING * stream_s
    ]


def profile_summary(prof: HardwareProfile) -> list[str]:
    """Lines for the operator: an expert's copy, the CPU curve's fixed cost and its cost per expert (and per expert
    beyond each band's ``after`` in a larger call), the runtime's terms where the profile has them, then a warning
    where the host moved and for each suspect CPU point."""
    from dllm_offload_sim.costmodel.cost_model import CostModel

    cm = CostModel(prof)
    eb = prof.model_shape["expert_bytes"]
    h2d = cm.expert_h2d_seconds()
    c = prof.curves["cpu_expert"]
    per = ", ".join(f"{s * 1e6:.0f}" for s in c["seconds"])
    lines = [
        f"H2D: one expert ({eb / 2**20:.1f} MiB) in {h2d * 1e6:.0f} us ({eb / h2d / 1e9:.1f} GB/s)",
        f"CPU experts ({c.get('engine', 'torch')} engine, {c.get('threads', '?')} threads): "
        f"{c.get('call_overhead_s', 0.0) * 1e3:.3f} ms per call + per expert at tokens {c['tokens']}: {per} us",
    ]
    for b in c.get("bands") or ():
        lines.append(
            f"  each expert beyond {b['after']} in a call: "
            + ", ".join(f"{x * 1e6:.0f}" for x in b["seconds"])
            + " us"
        )
    rt = prof.runtime or {}
    terms = [(name, rt[f]) for name, f in RUNTIME_LINE if f in rt]
    ratios = [(name, rt[f]) for name, f in RATIO_LINE if f in rt]
    if terms or ratios:
        lines.append(
            "runtime (us): "
            + ", ".join(f"{name} {v * 1e6:.1f}" for name, v in terms)
            + "".join(f"; {name} {v:.2f}" for name, v in ratios)
        )
    moved = host_moved(prof)
    if moved:
        lines.append(f"warning: {moved}")
    bad = suspect_cpu_points(prof)
    if bad:
        lines += [f"warning: {b}" for b in bad]
        lines.append(
            "warning: the CPU expert curve cannot be right there; `python bench/bench_cpu_engine.py` times "
            "the engine's calls alone. Predictions of CPU-path policies with this profile will be wrong."
        )
    return lines
