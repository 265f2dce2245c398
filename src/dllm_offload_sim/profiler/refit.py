"""A measured profile's CPU expert curve fitted again from the calls it stores, without a GPU.

``dllm-profile --refit PROFILE --out NEW``: a profile keeps the timed CPU calls behind its ``cpu_expert`` curve
(``cpu_expert.calls``: a 1-expert and a many-expert call at each point, and the larger calls of its bands) and the
round trip of the activations (``cpu_dispatch``). :func:`refit_cpu_expert` derives the curve's seconds per expert,
the fixed cost of a call and the bands from them again with the profiler's fit (``profiler.cpu_fit``'s
:func:`~dllm_offload_sim.profiler.cpu_fit.cpu_expert_fit` and :func:`~dllm_offload_sim.profiler.cpu_fit.cpu_band_fit`),
so a profile measured before a fix of the fit follows it. Nothing is measured or tuned: the stored times stay as
they are, and the profile's notes say that it was refitted.
"""

from __future__ import annotations

import copy

from dllm_offload_sim.costmodel.profile import HardwareProfile, ProfileError
from dllm_offload_sim.profiler.cpu_fit import cpu_band_fit, cpu_expert_fit


def refit_cpu_expert(prof: HardwareProfile) -> HardwareProfile:
    """A copy of ``prof`` whose ``cpu_expert`` seconds, ``call_overhead_s`` and ``bands`` are fitted again from its
    stored calls; raises :class:`ProfileError` (naming the field) where it stores none."""
    where = prof.path or prof.name
    cpu = prof.curves.get("cpu_expert") or {}
    calls = cpu.get("calls")
    if not calls or not all(k in calls for k in ("one_expert_s", "many_experts", "many_s")):
        raise ProfileError(
            where,
            "cpu_expert.calls",
            "missing: this profile keeps no timed CPU calls to fit again "
            "(measure it again with dllm-profile)",
        )
    tokens = list(cpu["tokens"])
    one, many_n, many = list(calls["one_expert_s"]), list(calls["many_experts"]), list(calls["many_s"])
    if not len(one) == len(many_n) == len(many) == len(tokens):
        raise ProfileError(
            where,
            "cpu_expert.calls",
            f"{len(one)} / {len(many_n)} / {len(many)} calls for {len(tokens)} points",
        )
    disp = prof.curves.get("cpu_dispatch") or {}
    dispatch = list(disp["seconds"]) if list(disp.get("tokens", [])) == tokens else None
    per_expert, overhead = cpu_expert_fit(tokens, one, many, many_n, dispatch)
    out = copy.deepcopy(prof)
    c = out.curves["cpu_expert"]
    c["seconds"], c["call_overhead_s"] = per_expert, overhead
    if c.get("bands"):
        after = [int(b["after"]) for b in c["bands"]]
        c["bands"] = cpu_band_fit(after, calls["band_experts"], calls["band_s"], many_n, many, per_expert)
    out.notes = (prof.notes + " " if prof.notes else "") + (
        "Refitted (dllm-profile --refit): cpu_expert seconds, call_overhead_s and bands derived again from the stored "
        "calls by profiler.cpu_fit.cpu_expert_fit / cpu_band_fit; no time was measured again."
    )
    out.path = ""
    return out
