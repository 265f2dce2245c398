"""The runtime's terms: what a profile's optional ``runtime`` block may hold, each once, as a typed record.

A runtime term is a cost of the running runtime that the curves do not hold (host work around a layer's calls, a
slowdown where two operations share host memory, how much longer decisions take in the replay), measured by
``dllm-profile`` on the runtime itself. The profile schema (which keys are allowed, seconds or ratios), the profile
merge, the scaling of host work to another host (:meth:`HardwareProfile.at_host_launch`), the cost model's defaults
and ``dllm-profile``'s summary all read :data:`RUNTIME_TERMS`. A new term is one record here, one probe in the
profiler (``profiler/measure.py``) and one charge site (the cost model or the simulator's engine).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeTerm:
    """One field of a profile's ``runtime`` block."""

    name: str  # the key under ``runtime``
    label: str  # how ``dllm-profile``'s summary names it
    unit: str  # "s" (seconds, >= 0) or "ratio" (>= 0)
    per: str  # what it is charged per
    meaning: str
    default: float | str  # what a profile without the field is charged: a value, or another term's name
    host_work: bool = False  # the replay's own host work: scales with the host's single-thread speed
    without: str = ""  # for a measured profile lacking it: what the simulator then does (named in a warning)


RUNTIME_TERMS: tuple[RuntimeTerm, ...] = (
    RuntimeTerm(
        "routing_sync_s",
        "routing sync",
        "s",
        "MoE layer",
        "waiting for the layer's routing: a stream synchronisation after the non-expert work, the wake-up "
        "beyond the GPU time",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "bookkeeping_s",
        "bookkeeping",
        "s",
        "MoE layer",
        "the runtime's own host work between the routing and the first expert work it issues (policy "
        "decisions excluded, charged apart)",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "layer_residual_s",
        "layer residual",
        "s",
        "MoE layer",
        "what a layer whose experts are all resident takes in the running replay beyond the curves and "
        "the terms above (the host's work around and after its grouped call)",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "forward_residual_s",
        "forward residual",
        "s",
        "forward",
        "the replay's own work at a forward's start and end, beyond the lm-head's curve",
        0.0,
        host_work=True,
        without="the layer residual holds the replay's per-forward work too, timed on a two-MoE-layer "
        "cut: a deeper stack is charged it once per layer",
    ),
    RuntimeTerm(
        "cpu_call_s",
        "CPU call in replay",
        "s",
        "CPU call",
        "what a CPU call costs in the running replay beyond the cpu_expert curve and its call overhead",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "cpu_issue_s",
        "CPU call issue",
        "s",
        "CPU call",
        "the host's time submitting a CPU call, spent before it issues the layer's copies and grouped calls",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "cpu_stall_per_copy_s",
        "stall per copy",
        "s",
        "demand copy beside a CPU call",
        "the older probe of a CPU call and its copies sharing host memory: the call's delay per copy, read "
        "as one slowdown shared by both where the two ratios below are absent",
        0.0,
    ),
    RuntimeTerm(
        "cpu_busy_gpu_s",
        "busy GPU per CPU call",
        "s",
        "CPU call",
        "what a CPU call's path takes longer while the GPU works beside it for the call's whole length, "
        "charged in proportion to the share of the call the layer's GPU path covers",
        0.0,
        without="a CPU call the GPU works beside (OLED's and clairvoyant_coop's layers) is charged nothing "
        "for it",
    ),
    RuntimeTerm(
        "prefetch_start_s",
        "prefetch start",
        "s",
        "prefetch",
        "the host's time starting a prefetch (the victim's eviction, the slots, the copy's issue, the "
        "arrival's admission), charged before the next MoE layer's decision",
        0.0,
        host_work=True,
    ),
    RuntimeTerm(
        "grouped_issue_s",
        "grouped call issue",
        "s",
        "grouped call",
        "the host's time issuing one grouped expert call (its inputs' upload and its graph's launch) in "
        "the running replay of the whole stack; a call is issued at no less than this",
        0.0,
        host_work=True,
        without="a grouped expert call is issued at the gpu_experts curve's host part, timed back to back, "
        "where the running replay issues it several times slower (docs/cost-model.md)",
    ),
    RuntimeTerm(
        "cpu_slowdown_beside_copies",
        "a CPU call's slowdown beside copies",
        "ratio",
        "CPU call",
        "while demand copies run beside it, a CPU call takes 1 + this times as long as alone",
        0.0,
        without="a CPU call and the demand copies beside it are slowed by the old probe's delay per copy, "
        "read as one shared slowdown (docs/cost-model.md)",
    ),
    RuntimeTerm(
        "copies_slowdown_beside_cpu",
        "copies' slowdown beside a CPU call",
        "ratio",
        "demand copy",
        "while a CPU call runs beside them, demand copies take 1 + this times as long as alone",
        0.0,
    ),
    RuntimeTerm(
        "bookkeeping_cpu_s",
        "bookkeeping beside the CPU engine",
        "s",
        "MoE layer after a CPU call",
        "the bookkeeping in a layer that follows one with a CPU call (the engine has just streamed its "
        "experts through the host's caches)",
        "bookkeeping_s",
        host_work=True,
        without="a layer's host steps beside the CPU expert engine are charged as without it, where the "
        "lent hosts run them up to 3x slower (docs/cost-model.md)",
    ),
    RuntimeTerm(
        "grouped_issue_cpu_s",
        "grouped call issue beside the CPU engine",
        "s",
        "grouped call",
        "a grouped call's issue in a layer with a CPU call",
        "grouped_issue_s",
        host_work=True,
    ),
    RuntimeTerm(
        "policy_time_factor",
        "policy-time factor",
        "ratio",
        "decision",
        "how much longer a policy's decisions take in the running replay than back to back in a "
        "simulation, where the validator measures the decision time it charges",
        1.0,
    ),
)
TERMS_BY_NAME = {t.name: t for t in RUNTIME_TERMS}


def runtime_value(runtime: dict | None, name: str) -> float:
    """The value of term ``name`` in a profile's ``runtime`` block: the block's, else the term's default (a value, or
    the value of the term it names). A name that is no term is a programming error (KeyError)."""
    term = TERMS_BY_NAME[name]
    if runtime and name in runtime:
        return float(runtime[name])
    return runtime_value(runtime, term.default) if isinstance(term.default, str) else float(term.default)
